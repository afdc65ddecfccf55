"""``torch.library`` custom ops around the Triton launchers of the kernel variants (fused gate_up activations,
relu², add + RMSNorm).

The variants' autograd Functions stay as they are; what torch.compile could not trace is the Triton launch
inside them (the interpreter's on CPU, host-side launch logic on the GPU). Under torch.compile a Function calls
these ops, each one opaque node with a fake; eagerly it calls the launcher itself (no dispatcher round trip).
Outputs: the launchers write fresh tensors, contiguous (rows); the fakes give exactly those.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import triton_add_rms_norm, triton_glu_variants
from .custom_ops import NS


def _dispatching(op, launcher):
    """A call of the custom op under torch.compile, of the launcher itself eagerly."""

    def run(*args):
        return op(*args) if torch.compiler.is_compiling() else launcher(*args)

    return run


# ---------------------------------------------------------------- gated activations over a fused gate_up, relu²
def _gate_up_fwd_launch(gate_up: Tensor, kind: str, limit: float, alpha: float) -> Tensor:
    return triton_glu_variants.gate_up_fwd(gate_up, kind, limit, alpha)


gate_up_fwd_op = torch.library.custom_op(f"{NS}::gate_up_fwd", _gate_up_fwd_launch, mutates_args=())


@gate_up_fwd_op.register_fake
def _(gate_up, kind, limit, alpha):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def _gate_up_bwd_launch(dout: Tensor, gate_up: Tensor, kind: str, limit: float, alpha: float) -> Tensor:
    return triton_glu_variants.gate_up_bwd(dout, gate_up, kind, limit, alpha)


gate_up_bwd_op = torch.library.custom_op(f"{NS}::gate_up_bwd", _gate_up_bwd_launch, mutates_args=())


@gate_up_bwd_op.register_fake
def _(dout, gate_up, kind, limit, alpha):
    return gate_up.new_empty(gate_up.shape)


def _relu_squared_launch(x: Tensor, dy: Tensor | None) -> Tensor:
    return triton_glu_variants.relu_squared_apply(x, dy)


relu_squared_op = torch.library.custom_op(f"{NS}::relu_squared", _relu_squared_launch, mutates_args=())


@relu_squared_op.register_fake
def _(x, dy):
    return x.new_empty(x.shape)


# ---------------------------------------------------------------- residual add + RMSNorm
def _add_rms_norm_fwd_launch(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, casting_mode: str
) -> tuple[Tensor, Tensor, Tensor]:
    return triton_add_rms_norm.add_rms_norm_fwd(x, residual, weight, eps, offset, casting_mode)


add_rms_norm_fwd_op = torch.library.custom_op(
    f"{NS}::add_rms_norm_fwd", _add_rms_norm_fwd_launch, mutates_args=()
)


@add_rms_norm_fwd_op.register_fake
def _(x, residual, weight, eps, offset, casting_mode):
    s_dtype = torch.promote_types(x.dtype, residual.dtype)
    y_dtype = torch.promote_types(s_dtype, weight.dtype) if casting_mode == "llama" else s_dtype
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        x.new_empty(x.shape, dtype=s_dtype),
        x.new_empty(x.shape, dtype=y_dtype),
        x.new_empty(rows, dtype=torch.float32),
    )


def _add_rms_norm_bwd_launch(
    dy: Tensor | None,
    ds: Tensor | None,
    s: Tensor,
    weight: Tensor,
    rstd: Tensor,
    offset: float,
    casting_mode: str,
    need_dw: bool,
) -> tuple[Tensor, Tensor]:
    """(d_sum, dw); dw is empty when it is not computed (no ``need_dw`` or no ``dy``)."""
    d, dw = triton_add_rms_norm.add_rms_norm_bwd(dy, ds, s, weight, rstd, offset, casting_mode, need_dw)
    return d, weight.new_empty(0) if dw is None else dw


add_rms_norm_bwd_op = torch.library.custom_op(
    f"{NS}::add_rms_norm_bwd", _add_rms_norm_bwd_launch, mutates_args=()
)


@add_rms_norm_bwd_op.register_fake
def _(dy, ds, s, weight, rstd, offset, casting_mode, need_dw):
    dw = weight.new_empty(weight.shape) if (need_dw and dy is not None) else weight.new_empty(0)
    return s.new_empty(s.shape), dw


gate_up_fwd = _dispatching(gate_up_fwd_op, _gate_up_fwd_launch)
gate_up_bwd = _dispatching(gate_up_bwd_op, _gate_up_bwd_launch)
relu_squared = _dispatching(relu_squared_op, _relu_squared_launch)
add_rms_norm_fwd = _dispatching(add_rms_norm_fwd_op, _add_rms_norm_fwd_launch)
add_rms_norm_bwd = _dispatching(add_rms_norm_bwd_op, _add_rms_norm_bwd_launch)
