"""Kernels: the public functional API; each op dispatches to Triton (CUDA) or PyTorch (CPU), see ``op``."""

from __future__ import annotations

import torch

from liger_registry.constants import IGNORE_INDEX
from liger_registry.limits import check_ignore_index, check_logit_factor

from .ce_output import CrossEntropyOutput, argmax_mode_for, ce_output, token_accuracy
from .ce_torch import check_ce_options
from .cross_entropy import cross_entropy_torch
from .custom_ops_loss import cross_entropy_fused, cross_entropy_triton
from .flce import FLCEOutput, FusedLinearCrossEntropyFunction
from .flce import fused_linear_cross_entropy as fused_linear_cross_entropy
from .flce_options import FlceOptions
from .flce_planner import FlcePlan, flce_chunk_geometry, flce_plan
from .glu import geglu, glu_fused, relu_squared, swiglu, swiglu_clamped
from .jsd import FusedLinearJSDFunction
from .jsd import fused_linear_jsd as fused_linear_jsd
from .norm import add_rms_norm, layer_norm, layer_norm_1p, rms_norm
from .op import (
    BACKENDS,
    ENV_VAR,
    OPS,
    BackendError,
    Op,
    backend_for,
    decide_backend,
    register,
    requested_backend,
    why_not_triton,
)
from .rope import rope, rope_variant

register(Op("cross_entropy", torch_impl=cross_entropy_torch, triton_impl=cross_entropy_triton))


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    lse_square_scale: float = 0.0,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    inplace_backward: bool = False,
):
    """Cross entropy over rows of ``logits`` [N, V]: ``F.cross_entropy`` (``weight``: class weights [V]; under
    ``mean`` the sum of the non-ignored targets' weights divides, as in torch) plus the options of
    :func:`fused_linear_cross_entropy` (``softcap``, z-loss ``lse_square_scale``); every target ignored gives 0.

    Accumulated in fp32, returned in the logits' dtype, as torch and the reference library return it. Returns
    the loss, or :class:`CrossEntropyOutput` when a ``return_*`` flag is set: ``z_loss`` (in the logits' dtype),
    ``token_accuracy`` (fp32, over non-ignored rows), ``predicted_tokens`` (row argmax, -1 on ignored rows).

    ``inplace_backward=True`` (opt-in) writes the gradient over ``logits`` in the forward pass when one is needed:
    the caller's logits hold d loss / d logits afterwards. It saves one [N, V] buffer and its write bandwidth
    (the reference library's default). Logits must be contiguous and not a partial view of a larger tensor
    (ValueError otherwise); another autograd node that saved them fails at backward with PyTorch's in-place
    error; eager only (ValueError under torch.compile); one backward, no double backward. See ``ce_inplace``."""
    check_ce_options(label_smoothing, softcap, reduction)
    check_ignore_index(ignore_index)
    if softcap is not None:
        check_logit_factor("softcap", float(softcap))
    if logits.dim() != 2 or target.shape != (logits.shape[0],):
        raise ValueError(
            f"logits must be [N, V] and target [N]; got {tuple(logits.shape)}, {tuple(target.shape)}"
        )
    if weight is not None and weight.shape != (logits.shape[1],):
        raise ValueError(f"weight must be [V]={logits.shape[1]}; got {tuple(weight.shape)}")
    options = dict(
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction=reduction,
        softcap=softcap,
        lse_square_scale=lse_square_scale,
        class_weights=weight,
        argmax_mode=argmax_mode_for(return_token_accuracy, return_predicted_tokens),
    )
    op = OPS["cross_entropy"]
    if not inplace_backward:
        loss, z_loss, predicted = op(logits, target, **options)
    else:
        backend, _ = op.decide(logits, target, **options)
        loss, z_loss, predicted = cross_entropy_fused(
            logits, target, **options, inplace_backward=True, backend=backend
        )
    accuracy = token_accuracy(predicted, target, ignore_index) if return_token_accuracy else None
    return ce_output(
        loss.to(logits.dtype),
        z_loss.to(logits.dtype),
        accuracy,
        predicted,
        return_z_loss=return_z_loss,
        return_token_accuracy=return_token_accuracy,
        return_predicted_tokens=return_predicted_tokens,
    )


__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "OPS",
    "BackendError",
    "CrossEntropyOutput",
    "FLCEOutput",
    "FlceOptions",
    "FlcePlan",
    "FusedLinearCrossEntropyFunction",
    "FusedLinearJSDFunction",
    "Op",
    "add_rms_norm",
    "backend_for",
    "cross_entropy",
    "decide_backend",
    "flce_chunk_geometry",
    "flce_plan",
    "fused_linear_cross_entropy",
    "fused_linear_jsd",
    "geglu",
    "glu_fused",
    "layer_norm",
    "layer_norm_1p",
    "register",
    "relu_squared",
    "requested_backend",
    "rms_norm",
    "rope",
    "rope_variant",
    "swiglu",
    "swiglu_clamped",
    "why_not_triton",
]
