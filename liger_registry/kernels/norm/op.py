"""The norm ops, each defined once with ``define_op``, and their registered backend Ops.

* Custom ops ``rms_norm_fwd`` / ``rms_norm_bwd`` (and ``rms_norm_bwd_``, dx over dy), ``layer_norm_fwd`` /
  ``layer_norm_bwd``, ``add_rms_norm_fwd`` / ``add_rms_norm_bwd``: implementation, fake, autograd, eager twin.
* Backend Ops ``RMS_NORM``, ``LAYER_NORM``, ``ADD_RMS_NORM``: ``reference`` on torch, the custom ops on Triton.
* Outputs are written contiguous (rows) whatever the input's layout: the row kernels write fresh outputs, their
  consumers (linear layers) want rows, and the torch branches make their results contiguous to agree, so the
  fake derived from the torch branch is exactly the Triton output's layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..backend import Op, register
from ..define import define_op, eager_twin
from . import reference as ref
from . import triton_kernels as tk


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _no_grad_of(weight: Tensor | None, x: Tensor) -> Tensor:
    """What a backward returns for a weight gradient it does not compute (the op returns a tensor): empty, of the
    weight's dtype, or of x's for a norm without a weight."""
    return _empty(x if weight is None else weight)


def _max_cols(limit: int = 65536):
    def check(x, *args, **kwargs):
        h = x.shape[-1] if isinstance(x, Tensor) and x.dim() else 0
        return [f"last dimension {h} > {limit} not supported by the row kernel"] if h > limit else []

    return check


# ---------------------------------------------------------------- RMSNorm
def _rms_norm_fwd_impl(
    x: Tensor, weight: Tensor | None, eps: float, offset: float, casting_mode: str, backend: str
) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps).reshape(-1)
        return ref.rms_norm_torch(x, weight, eps, offset, casting_mode).contiguous(), rstd
    return tk.launch_rms_norm_fwd(x, weight, eps, offset, casting_mode)


def _rms_norm_bwd_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    eps: float,
    offset: float,
    casting_mode: str,
    need_dw: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        dx, dw = ref.rms_norm_bwd_torch(dy, x, weight, eps, offset, casting_mode, need_dw)
        return dx.contiguous(), dw if dw is not None else _no_grad_of(weight, x)
    dx, dw = tk.launch_rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw)
    return dx, dw if dw is not None else _no_grad_of(weight, x)


# RMSNorm's forward and backward are triton_ops: under torch.compile inductor sees their kernels (define.py)
rms_norm_bwd = define_op("rms_norm_bwd", _rms_norm_bwd_impl, triton_op=True)


def _rms_norm_bwd_in_place_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    offset: float,
    casting_mode: str,
    need_dw: bool,
) -> Tensor:
    """Backward that writes dx over dy (saves one activation-sized buffer); dy must be x's dtype, contiguous."""
    dx, dw = tk.launch_rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw, in_place=True)
    if dx.data_ptr() != dy.data_ptr():
        dy.copy_(dx)
    return dw if dw is not None else _no_grad_of(weight, x)


def _rms_norm_bwd_in_place_fake(dy, x, weight, rstd, offset, casting_mode, need_dw):
    return weight.new_empty(weight.shape) if need_dw and weight is not None else _no_grad_of(weight, x)


# Triton only (no backend argument), so its fake is given
rms_norm_bwd_in_place = define_op(
    "rms_norm_bwd_", _rms_norm_bwd_in_place_impl, fake=_rms_norm_bwd_in_place_fake, mutates_args=("dy",)
)


def _rms_setup(ctx, inputs, output):
    x, weight, eps, offset, casting_mode, backend = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.args = (eps, offset, casting_mode, backend)


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = rms_norm_bwd.from_backward(ctx, dy, x, weight, rstd, *ctx.args[:3], need_dw, ctx.args[3])
    return dx, (dw if need_dw else None), None, None, None, None


def _rms_backward_in_place(ctx, dy, _drstd):
    """The backward of ``in_place_backward=True``: dx written over the incoming gradient when it can be."""
    x, weight, rstd = ctx.saved_tensors
    eps, offset, mode, backend = ctx.args
    need_dw = ctx.needs_input_grad[1]
    if dy.dtype == x.dtype and dy.is_contiguous():
        dx, dw = dy, rms_norm_bwd_in_place.impl(dy, x, weight, rstd, offset, mode, need_dw)
    else:
        dx, dw = rms_norm_bwd.impl(dy, x, weight, rstd, eps, offset, mode, need_dw, backend)
    return dx, (dw if need_dw else None), None, None, None, None


rms_norm_fwd = define_op(
    "rms_norm_fwd", _rms_norm_fwd_impl, setup=_rms_setup, backward=_rms_backward, aux=(1,), triton_op=True
)
# The same op with the in-place backward, eager only: it overwrites the gradient autograd hands it, which an
# AOT-traced backward cannot express (the incoming gradients are graph inputs it does not mutate).
_rms_norm_fwd_in_place_backward = eager_twin(
    "rms_norm_fwd_in_place_backward", _rms_norm_fwd_impl, _rms_setup, _rms_backward_in_place, aux=(1,)
)


def rms_norm_triton(x, weight, eps, offset=0.0, casting_mode="llama", in_place_backward=False):
    args = (x, weight, float(eps), float(offset), casting_mode, "triton")
    if in_place_backward and not torch.compiler.is_compiling():
        return _rms_norm_fwd_in_place_backward.apply(*args)[0]
    return rms_norm_fwd(*args)[0]


# ---------------------------------------------------------------- LayerNorm
def _layer_norm_fwd_impl(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, backend: str
) -> tuple[Tensor, Tensor, Tensor]:
    if backend == "torch":
        xf = x.float().reshape(-1, x.shape[-1])
        var, mean = torch.var_mean(xf, -1, unbiased=False)
        return ref.layer_norm_torch(x, weight, bias, eps).contiguous(), mean, torch.rsqrt(var + eps)
    return tk.launch_layer_norm_fwd(x, weight, bias, eps)


def _layer_norm_bwd_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    eps: float,
    need_dw: bool,
    need_db: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    if backend == "torch":
        dx, dw, db = ref.layer_norm_bwd_torch(dy, x, weight, bias, eps, need_dw, need_db)
        dx = dx.contiguous()
    else:
        dx, dw, db = tk.launch_layer_norm_bwd(
            dy, x, weight, mean, rstd, need_dw, need_db and bias is not None
        )
    return (
        dx,
        dw if dw is not None else _no_grad_of(weight, x),
        db if db is not None else _no_grad_of(weight, x),
    )


layer_norm_bwd = define_op("layer_norm_bwd", _layer_norm_bwd_impl)


def _ln_setup(ctx, inputs, output):
    x, weight, bias, eps, backend = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.args = (eps, backend)


def _ln_backward(ctx, dy, _dm, _dr):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need_dw, need_db = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    eps, backend = ctx.args
    dx, dw, db = layer_norm_bwd.from_backward(
        ctx, dy, x, weight, bias, mean, rstd, eps, need_dw, need_db, backend
    )
    return dx, (dw if need_dw else None), (db if need_db and bias is not None else None), None, None


layer_norm_fwd = define_op(
    "layer_norm_fwd", _layer_norm_fwd_impl, setup=_ln_setup, backward=_ln_backward, aux=(1, 2)
)


def layer_norm_triton(x, weight, bias, eps):
    return layer_norm_fwd(x, weight, bias, float(eps), "triton")[0]


# ---------------------------------------------------------------- residual add + RMSNorm
# Triton only (no backend argument: the torch path is add_rms_norm_torch under autograd), so the fakes are given.
def _add_rms_norm_fwd_impl(
    x: Tensor, residual: Tensor, weight: Tensor | None, eps: float, offset: float, casting_mode: str
) -> tuple[Tensor, Tensor, Tensor]:
    return tk.launch_add_rms_norm_fwd(x, residual, weight, eps, offset, casting_mode)


def _add_rms_norm_fwd_fake(x, residual, weight, eps, offset, casting_mode):
    s_dtype = torch.promote_types(x.dtype, residual.dtype)
    y_dtype = tk.norm_out_dtype(s_dtype, weight, casting_mode)
    rows = x.numel() // max(x.shape[-1], 1)
    return (
        x.new_empty(x.shape, dtype=s_dtype),
        x.new_empty(x.shape, dtype=y_dtype),
        x.new_empty(rows, dtype=torch.float32),
    )


def _add_rms_norm_bwd_impl(
    dy: Tensor | None,
    ds: Tensor | None,
    s: Tensor,
    weight: Tensor | None,
    rstd: Tensor,
    offset: float,
    casting_mode: str,
    need_dw: bool,
) -> tuple[Tensor, Tensor]:
    """(d_sum, dw); dw is empty when it is not computed (no ``need_dw``, no ``dy`` or no weight)."""
    d, dw = tk.launch_add_rms_norm_bwd(dy, ds, s, weight, rstd, offset, casting_mode, need_dw)
    return d, _no_grad_of(weight, s) if dw is None else dw


def _add_rms_norm_bwd_fake(dy, ds, s, weight, rstd, offset, casting_mode, need_dw):
    computed = need_dw and dy is not None and weight is not None
    dw = weight.new_empty(weight.shape) if computed else _no_grad_of(weight, s)
    return s.new_empty(s.shape), dw


add_rms_norm_bwd = define_op("add_rms_norm_bwd", _add_rms_norm_bwd_impl, fake=_add_rms_norm_bwd_fake)


def _add_rms_setup(ctx, inputs, output):
    x, residual, weight, _eps, offset, casting_mode = inputs
    ctx.save_for_backward(output[0], weight, output[2])
    ctx.args = (offset, casting_mode)
    ctx.dtypes = (x.dtype, residual.dtype)


def _add_rms_backward(ctx, ds, dy, _drstd):
    s, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[2]
    if ds is None and dy is None:
        return None, None, None, None, None, None
    d, dw = add_rms_norm_bwd.from_backward(ctx, dy, ds, s, weight, rstd, *ctx.args, need_dw)
    if not need_dw:
        dw = None
    elif dy is None:  # only the sum's gradient came back: the weight's is zero
        dw = torch.zeros_like(weight)
    # as autograd's own add does, x and residual receive the same gradient tensor
    return d.to(ctx.dtypes[0]), d.to(ctx.dtypes[1]), dw, None, None, None


add_rms_norm_fwd = define_op(
    "add_rms_norm_fwd",
    _add_rms_norm_fwd_impl,
    setup=_add_rms_setup,
    backward=_add_rms_backward,
    fake=_add_rms_norm_fwd_fake,
    aux=(2,),
)


def add_rms_norm_triton(x, residual, weight, eps: float, offset: float = 0.0, casting_mode: str = "llama"):
    s, y, _ = add_rms_norm_fwd(x, residual, weight, float(eps), float(offset), casting_mode)
    return s, y


RMS_NORM = register(
    Op("rms_norm", torch_impl=ref.rms_norm_torch, triton_impl=rms_norm_triton, extra_check=_max_cols())
)
LAYER_NORM = register(
    Op("layer_norm", torch_impl=ref.layer_norm_torch, triton_impl=layer_norm_triton, extra_check=_max_cols())
)
ADD_RMS_NORM = register(
    Op("add_rms_norm", torch_impl=ref.add_rms_norm_torch, triton_impl=add_rms_norm_triton)
)
