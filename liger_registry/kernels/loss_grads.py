"""The backward of the fused losses (CE, FLCE, JSD compute their gradients in the forward).

* :func:`check_backward`: the backward runs once and is not differentiated, else a clear error.
* :func:`scale_unless_one_`: scales the precomputed gradients by a scalar ``grad_output`` without a host sync
  (on CUDA a Triton kernel reads the scalar on the device and does nothing when it is 1; on the CPU, with no
  asynchrony, the host check stays).
* Why no sync: testing ``grad_output == 1`` on the host (``torch.equal``) waits for the whole forward to finish,
  so the host cannot queue ahead and every launch of the next chunked loop pays its latency; scaling
  unconditionally would cost a read and write of dW (docs/design/flce-layouts.md has the H200 figures of both).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import triton_utils as tu

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


BLOCK = 4096
PROGRAMS_PER_SM = 4


@triton.jit
def _scale_unless_one_kernel(X, G, n, BLOCK: tl.constexpr):
    g = tl.load(G).to(tl.float32)
    if g != 1.0:
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(X + offs, mask=mask).to(tl.float32)
            tl.store(X + offs, (x * g).to(X.dtype.element_ty), mask=mask)


def _programs(device: torch.device, n: int) -> int:
    return max(1, min(triton.cdiv(n, BLOCK), tu.sm_count(device) * PROGRAMS_PER_SM))


@torch.no_grad()
def scale_unless_one_(t: torch.Tensor, grad_output: torch.Tensor) -> None:
    """``t *= grad_output`` (a 0-d tensor) in place, skipped when ``grad_output`` is 1 (contiguous CUDA tensors)."""
    if t.numel() == 0:
        return
    if not t.is_cuda:
        if not torch.equal(grad_output, torch.ones_like(grad_output)):
            t.copy_(times_fp32(t, grad_output))
        return
    if not t.is_contiguous():
        t.copy_(times_fp32(t, grad_output))  # no sync either; only the skip is lost
        return
    g = grad_output.detach().reshape(1).to(device=t.device)
    _scale_unless_one_kernel[(_programs(t.device, t.numel()),)](t, g, t.numel(), BLOCK=BLOCK)


def times_fp32(t: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """``t * grad_output`` in fp32, as the kernel computes it (grad_output not rounded to t's dtype first)."""
    return t.float() * grad_output.to(device=t.device, dtype=torch.float32)


def no_output(*args) -> None:
    """The fake of the in-place scale ops: they write their arguments and return nothing."""
    return None
