"""``torch.library`` custom ops (namespace ``liger_registry``) wrapping the Triton kernels.

Each op has a fake (meta) implementation and a registered autograd formula, so ``torch.compile`` treats it
as one opaque node without a graph break. Every op also runs with the PyTorch implementation when the
backend resolves to torch (``LIGER_REGISTRY_BACKEND=torch``, or ``auto`` on CPU tensors), so a direct call
of ``torch.ops.liger_registry.*`` works everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import reference, triton_glu, triton_norm, triton_rope
from .op import requested_backend

NS = "liger_registry"


def _use_torch(*tensors: Tensor) -> bool:
    b = requested_backend()
    return b == "torch" or (b == "auto" and not any(t.is_cuda for t in tensors))


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


# ---------------------------------------------------------------- RMSNorm
def _rms_out_dtype(x: Tensor, w: Tensor, mode: str) -> torch.dtype:
    return torch.promote_types(x.dtype, w.dtype) if mode == "llama" else x.dtype


@torch.library.custom_op(f"{NS}::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: Tensor, weight: Tensor, eps: float, offset: float, casting_mode: str) -> tuple[Tensor, Tensor]:
    if _use_torch(x, weight):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps).reshape(-1)
        return reference.rms_norm_torch(x, weight, eps, offset, casting_mode), rstd
    return triton_norm.rms_norm_fwd(x, weight, eps, offset, casting_mode)


@rms_norm_fwd.register_fake
def _(x, weight, eps, offset, casting_mode):
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 1
    return x.new_empty(x.shape, dtype=_rms_out_dtype(x, weight, casting_mode)), x.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op(f"{NS}::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, eps: float, offset: float, casting_mode: str, need_dw: bool
) -> tuple[Tensor, Tensor]:
    if _use_torch(x, weight):
        dx, dw = reference.rms_norm_bwd_torch(dy, x, weight, eps, offset, casting_mode, need_dw)
        return dx, dw if dw is not None else _empty(weight)
    dx, dw = triton_norm.rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw)
    return dx, dw if dw is not None else _empty(weight)


@rms_norm_bwd.register_fake
def _(dy, x, weight, rstd, eps, offset, casting_mode, need_dw):
    return torch.empty_like(x), torch.empty_like(weight) if need_dw else weight.new_empty(0)


@torch.library.custom_op(f"{NS}::rms_norm_bwd_", mutates_args=("dy",))
def rms_norm_bwd_inplace(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float, casting_mode: str, need_dw: bool
) -> Tensor:
    """Backward that writes dx over dy (saves one activation-sized buffer); dy must be x's dtype, contiguous."""
    dx, dw = triton_norm.rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw, in_place=True)
    if dx.data_ptr() != dy.data_ptr():
        dy.copy_(dx)
    return dw if dw is not None else _empty(weight)


@rms_norm_bwd_inplace.register_fake
def _(dy, x, weight, rstd, offset, casting_mode, need_dw):
    return torch.empty_like(weight) if need_dw else weight.new_empty(0)


def _rms_setup(ctx, inputs, output):
    x, weight, eps, offset, casting_mode = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.args = (eps, offset, casting_mode)
    ctx.in_place = False


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    eps, offset, mode = ctx.args
    need_dw = ctx.needs_input_grad[1]
    dx, dw = rms_norm_bwd(dy, x, weight, rstd, eps, offset, mode, need_dw)
    return dx, (dw if need_dw else None), None, None, None


torch.library.register_autograd(f"{NS}::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)


class _RMSNormInPlaceBackward(torch.autograd.Function):
    """RMSNorm whose backward overwrites the incoming gradient with dx (opt-in: only safe when nothing else
    reads that gradient tensor, which autograd does not guarantee, e.g. after an ``add``)."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode):
        y, rstd = rms_norm_fwd(x, weight, eps, offset, casting_mode)
        ctx.save_for_backward(x, weight, rstd)
        ctx.args = (eps, offset, casting_mode)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        eps, offset, mode = ctx.args
        need_dw = ctx.needs_input_grad[1]
        if dy.dtype == x.dtype and dy.is_contiguous() and not _use_torch(x):
            dw = rms_norm_bwd_inplace(dy, x, weight, rstd, offset, mode, need_dw)
            dx = dy
        else:
            dx, dw = rms_norm_bwd(dy, x, weight, rstd, eps, offset, mode, need_dw)
        return dx, (dw if need_dw else None), None, None, None


def rms_norm_triton(x, weight, eps, offset=0.0, casting_mode="llama", in_place_backward=False):
    if in_place_backward:
        return _RMSNormInPlaceBackward.apply(x, weight, float(eps), float(offset), casting_mode)
    return rms_norm_fwd(x, weight, float(eps), float(offset), casting_mode)[0]


# ---------------------------------------------------------------- LayerNorm
@torch.library.custom_op(f"{NS}::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    if _use_torch(x, weight):
        xf = x.float().reshape(-1, x.shape[-1])
        var, mean = torch.var_mean(xf, -1, unbiased=False)
        return reference.layer_norm_torch(x, weight, bias, eps), mean, torch.rsqrt(var + eps)
    return triton_norm.layer_norm_fwd(x, weight, bias, eps)


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    rows = x.numel() // max(x.shape[-1], 1)
    return torch.empty_like(x), x.new_empty(rows, dtype=torch.float32), x.new_empty(rows, dtype=torch.float32)


@torch.library.custom_op(f"{NS}::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, mean: Tensor, rstd: Tensor, eps: float,
    need_dw: bool, need_db: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    if _use_torch(x, weight):
        dx, dw, db = reference.layer_norm_bwd_torch(dy, x, weight, bias, eps, need_dw, need_db)
    else:
        dx, dw, db = triton_norm.layer_norm_bwd(dy, x, weight, mean, rstd, need_dw, need_db and bias is not None)
    return dx, dw if dw is not None else _empty(weight), db if db is not None else _empty(weight)


@layer_norm_bwd.register_fake
def _(dy, x, weight, bias, mean, rstd, eps, need_dw, need_db):
    return (
        torch.empty_like(x),
        torch.empty_like(weight) if need_dw else weight.new_empty(0),
        torch.empty_like(weight) if (need_db and bias is not None) else weight.new_empty(0),
    )


def _ln_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.eps = eps


def _ln_backward(ctx, dy, _dm, _dr):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need_dw, need_db = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    dx, dw, db = layer_norm_bwd(dy, x, weight, bias, mean, rstd, ctx.eps, need_dw, need_db)
    return dx, (dw if need_dw else None), (db if need_db and bias is not None else None), None


torch.library.register_autograd(f"{NS}::layer_norm_fwd", _ln_backward, setup_context=_ln_setup)


def layer_norm_triton(x, weight, bias, eps):
    return layer_norm_fwd(x, weight, bias, float(eps))[0]


# ---------------------------------------------------------------- RoPE
@torch.library.custom_op(f"{NS}::rope", mutates_args=())
def rope_op(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, backward: bool) -> tuple[Tensor, Tensor]:
    if _use_torch(q, k):
        if not backward:
            return reference.rope_torch(q, k, cos, sin)
        return reference.rope_bwd_torch(q, k, cos, sin)  # q, k are the incoming grads here
    return triton_rope.rope_apply(q, k, cos, sin, backward=backward)


@rope_op.register_fake
def _(q, k, cos, sin, backward):
    return (
        q.new_empty(q.shape, dtype=torch.promote_types(q.dtype, cos.dtype)),
        k.new_empty(k.shape, dtype=torch.promote_types(k.dtype, cos.dtype)),
    )


def _rope_setup(ctx, inputs, output):
    q, k, cos, sin, _ = inputs
    ctx.save_for_backward(cos, sin)
    ctx.dtypes = (q.dtype, k.dtype)


def _rope_backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    gq, gk = rope_op(dq, dk, cos, sin, True)
    return gq.to(ctx.dtypes[0]), gk.to(ctx.dtypes[1]), None, None, None


torch.library.register_autograd(f"{NS}::rope", _rope_backward, setup_context=_rope_setup)


def rope_triton(q, k, cos, sin):
    return rope_op(q, k, cos, sin, False)


# ---------------------------------------------------------------- SwiGLU / GeGLU
_GLU_TORCH = {0: reference.swiglu_torch, 1: reference.geglu_torch}


@torch.library.custom_op(f"{NS}::glu_fwd", mutates_args=())
def glu_fwd(gate: Tensor, up: Tensor, kind: int) -> Tensor:
    if _use_torch(gate, up):
        return _GLU_TORCH[kind](gate, up)
    return triton_glu.glu_fwd(gate, up, kind)


@glu_fwd.register_fake
def _(gate, up, kind):
    return gate.new_empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype))


@torch.library.custom_op(f"{NS}::glu_bwd", mutates_args=())
def glu_bwd(dc: Tensor, gate: Tensor, up: Tensor, kind: int) -> tuple[Tensor, Tensor]:
    if _use_torch(gate, up):
        return reference.glu_bwd_torch(dc, gate, up, kind)
    return triton_glu.glu_bwd(dc, gate, up, kind)


@glu_bwd.register_fake
def _(dc, gate, up, kind):
    return torch.empty_like(gate), torch.empty_like(up)


def _glu_setup(ctx, inputs, output):
    gate, up, kind = inputs
    ctx.save_for_backward(gate, up)
    ctx.kind = kind


def _glu_backward(ctx, dc):
    gate, up = ctx.saved_tensors
    da, db = glu_bwd(dc, gate, up, ctx.kind)
    return da, db, None


torch.library.register_autograd(f"{NS}::glu_fwd", _glu_backward, setup_context=_glu_setup)


def swiglu_triton(gate, up):
    return glu_fwd(gate, up, 0)


def geglu_triton(gate, up):
    return glu_fwd(gate, up, 1)
