"""The check of the loss kernels' backward: once per graph, and not differentiable again (create_graph)."""

from __future__ import annotations

from typing import Any

import torch

_OPTION = (
    "pass skip_logits=False to the patched forward (logits and the model's own loss), or apply(model, "
    "fused_linear_cross_entropy=False); on the kernel itself, reduction='none' recomputes in backward"
)


def check_backward(ctx: Any, kernel: str, *, once: bool) -> None:
    """Raise a clear error where the kernel's precomputed gradients would be wrong.

    `once`: the forward computed the gradients and backward scales them in place, so a second backward over the
    same graph (retain_graph=True, autograd.grad twice) would scale them again. create_graph=True (gradient
    penalties) needs a differentiable backward, which the fused kernels do not have.
    """
    if torch.compiler.is_compiling():
        return
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"liger_registry: {kernel} cannot be differentiated twice (create_graph=True, gradient penalties): "
            + _OPTION
        )
    if once:
        if getattr(ctx, "backward_done", False):
            raise RuntimeError(
                f"liger_registry: {kernel} computes its gradients in the forward and can backward once per graph "
                "(a second backward, retain_graph=True, would scale them again): " + _OPTION
            )
        ctx.backward_done = True
