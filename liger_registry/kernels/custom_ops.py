"""``torch.library`` custom ops (namespace ``liger_registry``) wrapping the Triton kernels.

Each op has a fake (meta) implementation and a registered autograd formula, so ``torch.compile`` treats it
as one opaque node without a graph break. Each op takes the backend decided by its ``Op`` (``"triton"`` or
``"torch"``) as its last argument and does not decide again; with ``"torch"`` it runs the PyTorch formulas, so a
direct call of ``torch.ops.liger_registry.*`` works everywhere.

Layouts: a fake gives exactly the shape, dtype and strides of its op's outputs on both backends (inductor
asserts them). The row ops (norms, GLU) write fresh outputs, so writing them contiguous costs nothing and
their consumers (linear layers) want rows anyway: every output is contiguous, whatever the input's layout, and
the torch branch makes its result contiguous to agree. (RoPE keeps its input's layout: see ``rope.ops``.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import torch_impl, triton_glu, triton_norm
from .define import define_op

NS = "liger_registry"


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _rows_like(x: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """A new contiguous tensor of x's shape (the layout of every row op's outputs)."""
    return x.new_empty(x.shape, dtype=dtype or x.dtype)


def _eager_function(name: str, impl, setup, backward, aux: tuple[int, ...] = ()):
    """An autograd.Function running the same impl / setup / backward as a custom op, without the dispatcher
    round trip: eager calls take it (lowest launch overhead), torch.compile takes the custom op."""

    def forward(ctx, *inputs):
        out = impl(*inputs)
        ctx.eager = True
        # no zero-filled grads for unused / auxiliary outputs (CE's saved gradient is as large as the logits)
        ctx.set_materialize_grads(False)
        setup(ctx, inputs, out)
        if aux:
            ctx.mark_non_differentiable(*[out[i] for i in aux])
        return out

    return type(
        name,
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(lambda ctx, *g: backward(ctx, *g))},
    )


def _call(op, eager_fn, *args):
    if torch.compiler.is_compiling():
        return op(*args)
    return eager_fn.apply(*args)


# ---------------------------------------------------------------- RMSNorm
def _rms_out_dtype(x: Tensor, w: Tensor, mode: str) -> torch.dtype:
    return torch.promote_types(x.dtype, w.dtype) if mode == "llama" else x.dtype


def _rms_norm_fwd_impl(
    x: Tensor, weight: Tensor, eps: float, offset: float, casting_mode: str, backend: str
) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps).reshape(-1)
        return torch_impl.rms_norm_torch(x, weight, eps, offset, casting_mode).contiguous(), rstd
    return triton_norm.rms_norm_fwd(x, weight, eps, offset, casting_mode)


rms_norm_fwd = torch.library.custom_op(f"{NS}::rms_norm_fwd", _rms_norm_fwd_impl, mutates_args=())


@rms_norm_fwd.register_fake
def _(x, weight, eps, offset, casting_mode, backend):
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 1
    return _rows_like(x, _rms_out_dtype(x, weight, casting_mode)), x.new_empty(rows, dtype=torch.float32)


def _rms_norm_bwd_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    rstd: Tensor,
    eps: float,
    offset: float,
    casting_mode: str,
    need_dw: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        dx, dw = torch_impl.rms_norm_bwd_torch(dy, x, weight, eps, offset, casting_mode, need_dw)
        return dx.contiguous(), dw if dw is not None else _empty(weight)
    dx, dw = triton_norm.rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw)
    return dx, dw if dw is not None else _empty(weight)


rms_norm_bwd = torch.library.custom_op(f"{NS}::rms_norm_bwd", _rms_norm_bwd_impl, mutates_args=())


@rms_norm_bwd.register_fake
def _(dy, x, weight, rstd, eps, offset, casting_mode, need_dw, backend):
    return _rows_like(x), _rows_like(weight) if need_dw else weight.new_empty(0)


def _rms_norm_bwd_inplace_impl(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float, casting_mode: str, need_dw: bool
) -> Tensor:
    """Backward that writes dx over dy (saves one activation-sized buffer); dy must be x's dtype, contiguous."""
    dx, dw = triton_norm.rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw, in_place=True)
    if dx.data_ptr() != dy.data_ptr():
        dy.copy_(dx)
    return dw if dw is not None else _empty(weight)


rms_norm_bwd_inplace = torch.library.custom_op(
    f"{NS}::rms_norm_bwd_", _rms_norm_bwd_inplace_impl, mutates_args=("dy",)
)


@rms_norm_bwd_inplace.register_fake
def _(dy, x, weight, rstd, offset, casting_mode, need_dw):
    return _rows_like(weight) if need_dw else weight.new_empty(0)


def _rms_setup(ctx, inputs, output):
    x, weight, eps, offset, casting_mode, backend = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.args = (eps, offset, casting_mode, backend)
    ctx.in_place = False


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    eps, offset, mode, backend = ctx.args
    need_dw = ctx.needs_input_grad[1]
    bwd = _rms_norm_bwd_impl if getattr(ctx, "eager", False) else rms_norm_bwd
    dx, dw = bwd(dy, x, weight, rstd, eps, offset, mode, need_dw, backend)
    return dx, (dw if need_dw else None), None, None, None, None


torch.library.register_autograd(f"{NS}::rms_norm_fwd", _rms_backward, setup_context=_rms_setup)


class _RMSNormInPlaceBackward(torch.autograd.Function):
    """RMSNorm whose backward overwrites the incoming gradient with dx (opt-in: only safe when nothing else
    reads that gradient tensor, which autograd does not guarantee, e.g. after an ``add``)."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode):
        y, rstd = _rms_norm_fwd_impl(x, weight, eps, offset, casting_mode, "triton")
        ctx.save_for_backward(x, weight, rstd)
        ctx.args = (eps, offset, casting_mode)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        eps, offset, mode = ctx.args
        need_dw = ctx.needs_input_grad[1]
        if dy.dtype == x.dtype and dy.is_contiguous():
            dw = _rms_norm_bwd_inplace_impl(dy, x, weight, rstd, offset, mode, need_dw)
            dx = dy
        else:
            dx, dw = _rms_norm_bwd_impl(dy, x, weight, rstd, eps, offset, mode, need_dw, "triton")
        return dx, (dw if need_dw else None), None, None, None


_RMSNormFn = _eager_function("_RMSNormFn", _rms_norm_fwd_impl, _rms_setup, _rms_backward, aux=(1,))


def rms_norm_triton(x, weight, eps, offset=0.0, casting_mode="llama", in_place_backward=False):
    if in_place_backward and not torch.compiler.is_compiling():
        return _RMSNormInPlaceBackward.apply(x, weight, float(eps), float(offset), casting_mode)
    return _call(rms_norm_fwd, _RMSNormFn, x, weight, float(eps), float(offset), casting_mode, "triton")[0]


# ---------------------------------------------------------------- LayerNorm
def _layer_norm_fwd_impl(
    x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, backend: str
) -> tuple[Tensor, Tensor, Tensor]:
    if backend == "torch":
        xf = x.float().reshape(-1, x.shape[-1])
        var, mean = torch.var_mean(xf, -1, unbiased=False)
        return torch_impl.layer_norm_torch(x, weight, bias, eps).contiguous(), mean, torch.rsqrt(var + eps)
    return triton_norm.layer_norm_fwd(x, weight, bias, eps)


layer_norm_fwd = torch.library.custom_op(f"{NS}::layer_norm_fwd", _layer_norm_fwd_impl, mutates_args=())


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps, backend):
    rows = x.numel() // max(x.shape[-1], 1)
    return _rows_like(x), x.new_empty(rows, dtype=torch.float32), x.new_empty(rows, dtype=torch.float32)


def _layer_norm_bwd_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    eps: float,
    need_dw: bool,
    need_db: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    if backend == "torch":
        dx, dw, db = torch_impl.layer_norm_bwd_torch(dy, x, weight, bias, eps, need_dw, need_db)
        dx = dx.contiguous()
    else:
        dx, dw, db = triton_norm.layer_norm_bwd(
            dy, x, weight, mean, rstd, need_dw, need_db and bias is not None
        )
    return dx, dw if dw is not None else _empty(weight), db if db is not None else _empty(weight)


layer_norm_bwd = torch.library.custom_op(f"{NS}::layer_norm_bwd", _layer_norm_bwd_impl, mutates_args=())


@layer_norm_bwd.register_fake
def _(dy, x, weight, bias, mean, rstd, eps, need_dw, need_db, backend):
    return (
        _rows_like(x),
        _rows_like(weight) if need_dw else weight.new_empty(0),
        _rows_like(weight) if (need_db and bias is not None) else weight.new_empty(0),
    )


def _ln_setup(ctx, inputs, output):
    x, weight, bias, eps, backend = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.args = (eps, backend)


def _ln_backward(ctx, dy, _dm, _dr):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need_dw, need_db = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    bwd = _layer_norm_bwd_impl if getattr(ctx, "eager", False) else layer_norm_bwd
    eps, backend = ctx.args
    dx, dw, db = bwd(dy, x, weight, bias, mean, rstd, eps, need_dw, need_db, backend)
    return dx, (dw if need_dw else None), (db if need_db and bias is not None else None), None, None


torch.library.register_autograd(f"{NS}::layer_norm_fwd", _ln_backward, setup_context=_ln_setup)


_LayerNormFn = _eager_function("_LayerNormFn", _layer_norm_fwd_impl, _ln_setup, _ln_backward, aux=(1, 2))


def layer_norm_triton(x, weight, bias, eps):
    return _call(layer_norm_fwd, _LayerNormFn, x, weight, bias, float(eps), "triton")[0]


# ---------------------------------------------------------------- SwiGLU / GeGLU
_GLU_TORCH = {0: torch_impl.swiglu_torch, 1: torch_impl.geglu_torch}


def _glu_fwd_impl(gate: Tensor, up: Tensor, kind: int, backend: str) -> Tensor:
    if backend == "torch":
        return _GLU_TORCH[kind](gate, up).contiguous()
    return triton_glu.glu_fwd(gate, up, kind)


def _glu_bwd_impl(dc: Tensor, gate: Tensor, up: Tensor, kind: int, backend: str) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        da, db = torch_impl.glu_bwd_torch(dc, gate, up, kind)
        return da.contiguous(), db.contiguous()
    return triton_glu.glu_bwd(dc, gate, up, kind)


glu_bwd = define_op("glu_bwd", _glu_bwd_impl)


def _glu_setup(ctx, inputs, output):
    gate, up, kind, backend = inputs
    ctx.save_for_backward(gate, up)
    ctx.args = (kind, backend)


def _glu_backward(ctx, dc):
    gate, up = ctx.saved_tensors
    da, db = glu_bwd.from_backward(ctx, dc, gate, up, *ctx.args)
    return da, db, None, None


glu_fwd = define_op("glu_fwd", _glu_fwd_impl, setup=_glu_setup, backward=_glu_backward)


def swiglu_triton(gate, up):
    return glu_fwd(gate, up, 0, "triton")


def geglu_triton(gate, up):
    return glu_fwd(gate, up, 1, "triton")
