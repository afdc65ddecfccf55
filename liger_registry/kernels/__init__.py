"""Kernels: the public functional API; each op dispatches to Triton (CUDA) or PyTorch (CPU), see ``op``."""

from __future__ import annotations

import torch

from liger_registry.constants import IGNORE_INDEX
from liger_registry.limits import check_ignore_index, check_logit_factor

from . import torch_impl
from .ce_output import CrossEntropyOutput, argmax_mode_for, ce_output, token_accuracy
from .ce_torch import check_ce_options
from .cross_entropy import cross_entropy_torch
from .custom_ops import geglu_triton, layer_norm_triton, rms_norm_triton, swiglu_triton
from .custom_ops_loss import cross_entropy_fused, cross_entropy_triton
from .flce import FLCEOutput, FusedLinearCrossEntropyFunction
from .flce import fused_linear_cross_entropy as fused_linear_cross_entropy
from .flce_options import FlceOptions
from .flce_planner import FlcePlan, flce_chunk_geometry, flce_plan
from .jsd import FusedLinearJSDFunction
from .jsd import fused_linear_jsd as fused_linear_jsd
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


def _max_cols(limit: int = 65536):
    def check(x, *args, **kwargs):
        h = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
        return [f"last dimension {h} > {limit} not supported by the row kernel"] if h > limit else []

    return check


register(Op("cross_entropy", torch_impl=cross_entropy_torch, triton_impl=cross_entropy_triton))
register(
    Op("rms_norm", torch_impl=torch_impl.rms_norm_torch, triton_impl=rms_norm_triton, extra_check=_max_cols())
)
register(
    Op(
        "layer_norm",
        torch_impl=torch_impl.layer_norm_torch,
        triton_impl=layer_norm_triton,
        extra_check=_max_cols(),
    )
)
register(Op("swiglu", torch_impl=torch_impl.swiglu_torch, triton_impl=swiglu_triton))
register(Op("geglu", torch_impl=torch_impl.geglu_torch, triton_impl=geglu_triton))

# the issue-12 variants register their ops on import (glu_fused, swiglu_clamped, relu_squared, add_rms_norm),
# so decide_backend and explain know them
from . import add_rms_norm as _add_rms_norm  # noqa: E402, F401
from . import glu_variants as _glu_variants  # noqa: E402, F401


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


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
    *,
    in_place_backward: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dim; casting modes ``llama`` | ``gemma`` | ``none`` (see
    :func:`torch_impl.rms_norm_torch` for what each means and why it exists).

    ``in_place_backward=True`` lets the Triton backward overwrite the incoming gradient with dx (saves one
    activation-sized buffer). Off by default: it is only safe when nothing else reads that gradient tensor,
    and autograd may hand the same tensor to several consumers (e.g. both inputs of an ``add``)."""
    torch_impl.check_casting_mode(casting_mode)
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    op = OPS["rms_norm"]
    backend, _ = op.decide(x, weight, eps, offset, casting_mode)
    if backend == "triton":
        return op.triton_impl(x, weight, eps, offset, casting_mode, in_place_backward)
    return op.torch_impl(x, weight, eps, offset, casting_mode)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim (``F.layer_norm``)."""
    if weight.shape != (x.shape[-1],) or (bias is not None and bias.shape != (x.shape[-1],)):
        raise ValueError(f"layer_norm: weight/bias must be [{x.shape[-1]}]")
    return OPS["layer_norm"](x, weight, bias, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    return OPS["swiglu"](gate, up)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up``."""
    if gate.shape != up.shape:
        raise ValueError(f"geglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    return OPS["geglu"](gate, up)


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
    "backend_for",
    "cross_entropy",
    "decide_backend",
    "flce_chunk_geometry",
    "flce_plan",
    "fused_linear_cross_entropy",
    "fused_linear_jsd",
    "geglu",
    "layer_norm",
    "register",
    "requested_backend",
    "rms_norm",
    "rope",
    "rope_variant",
    "swiglu",
    "why_not_triton",
]
