"""Fused residual add + RMSNorm: ``(residual + x, rmsnorm(residual + x))`` in one kernel, forward and backward.

A decoder layer computes ``hidden = residual + hidden`` and then normalises it (the next norm's input is the
new residual). Fused, the sum is written once and read once. Casting modes as :func:`kernels.rms_norm`:
``llama`` (``LlamaRMSNorm``: the normalised sum is cast to its dtype, then times the weight) and ``gemma``
(``Gemma3RMSNorm`` with ``offset=1``: all in fp32, ``* (offset + weight)``, cast at the end).
"""

from __future__ import annotations

import torch

from .op import Op, register
from .torch_impl import rms_norm_torch

try:
    from . import custom_ops_variants as _ops
except ImportError:  # pragma: no cover - no triton: torch only
    _ops = None

ADD_RMS_MODES = ("llama", "gemma")


def add_rms_norm_torch(x, residual, weight, eps: float, offset: float = 0.0, casting_mode: str = "llama"):
    """PyTorch implementation: the eager add, then the RMSNorm of the casting mode."""
    s = residual + x
    return s, rms_norm_torch(s, weight, eps, offset, casting_mode)


class AddRMSNormFunction(torch.autograd.Function):
    """Triton forward and backward of the fused add + RMSNorm; saves the sum, the weight and 1/rms per row."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps: float, offset: float, casting_mode: str):
        s, y, rstd = _ops.add_rms_norm_fwd(x, residual, weight, eps, offset, casting_mode)
        ctx.save_for_backward(s, weight, rstd)
        ctx.args = (offset, casting_mode)
        ctx.dtypes = (x.dtype, residual.dtype)
        ctx.set_materialize_grads(False)
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):
        s, weight, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[2]
        if ds is None and dy is None:
            return None, None, None, None, None, None
        d, dw = _ops.add_rms_norm_bwd(dy, ds, s, weight, rstd, *ctx.args, need_dw)
        if not need_dw:
            dw = None
        elif dy is None:  # only the sum's gradient came back: the weight's is zero
            dw = torch.zeros_like(weight)
        # as autograd's own add does, x and residual receive the same gradient tensor
        return d.to(ctx.dtypes[0]), d.to(ctx.dtypes[1]), dw, None, None, None


def add_rms_norm_triton(x, residual, weight, eps: float, offset: float = 0.0, casting_mode: str = "llama"):
    return AddRMSNormFunction.apply(x, residual, weight, float(eps), float(offset), casting_mode)


ADD_RMS_NORM = register(
    Op("add_rms_norm", torch_impl=add_rms_norm_torch, triton_impl=add_rms_norm_triton if _ops else None)
)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + x, rmsnorm(residual + x))`` with the norm's weight, epsilon, offset and casting mode."""
    if casting_mode not in ADD_RMS_MODES:
        raise ValueError(
            f"add_rms_norm: casting_mode={casting_mode!r}; expected one of {', '.join(ADD_RMS_MODES)}"
        )
    if x.shape != residual.shape:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} and residual {tuple(residual.shape)} differ")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"add_rms_norm: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    return ADD_RMS_NORM(x, residual, weight, eps, offset, casting_mode)
