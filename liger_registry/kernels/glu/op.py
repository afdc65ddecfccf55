"""The GLU ops, each defined once with ``define_op``, and their registered backend Ops.

* Custom ops ``glu_fwd`` / ``glu_bwd`` (split gate and up), ``gate_up_fwd`` / ``gate_up_bwd`` (over a fused
  gate_up: SwiGLU, GeGLU, GPT-OSS's clamped SwiGLU), ``relu_squared`` (both passes).
* Backend Ops ``SWIGLU``, ``GEGLU``, ``GLU_FUSED``, ``SWIGLU_CLAMPED``, ``RELU_SQUARED``: ``reference`` on torch,
  the custom ops on Triton.
* Outputs are written contiguous (rows) whatever the inputs' layout; the split GLU's torch branch makes its
  result contiguous to agree, so its derived fake is exactly the Triton output's layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..backend import Op, register
from ..define import define_op, eager_twin
from . import reference as ref
from . import triton_kernels as tk

# ---------------------------------------------------------------- SwiGLU / GeGLU on split gate and up
_GLU_TORCH = {tk.SILU: ref.swiglu_torch, tk.GELU_TANH: ref.geglu_torch}


def _glu_fwd_impl(
    gate: Tensor, up: Tensor, kind: int, gate_multiplier: float, down_multiplier: float, backend: str
) -> Tensor:
    if backend == "torch":
        return _GLU_TORCH[kind](gate, up, gate_multiplier, down_multiplier).contiguous()
    return tk.launch_glu_fwd(gate, up, kind, gate_multiplier, down_multiplier)


def _glu_bwd_impl(
    dc: Tensor,
    gate: Tensor,
    up: Tensor,
    kind: int,
    gate_multiplier: float,
    down_multiplier: float,
    backend: str,
) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        da, db = ref.glu_bwd_torch(dc, gate, up, kind, gate_multiplier, down_multiplier)
        return da.contiguous(), db.contiguous()
    return tk.launch_glu_bwd(dc, gate, up, kind, gate_multiplier, down_multiplier)


glu_bwd = define_op("glu_bwd", _glu_bwd_impl)


def _glu_setup(ctx, inputs, output):
    gate, up, *options = inputs
    ctx.save_for_backward(gate, up)
    ctx.args = options  # kind, gate_multiplier, down_multiplier, backend


def _glu_backward(ctx, dc):
    gate, up = ctx.saved_tensors
    da, db = glu_bwd.from_backward(ctx, dc, gate, up, *ctx.args)
    return da, db, None, None, None, None


def _disjoint(a: Tensor, b: Tensor) -> bool:
    """Whether two contiguous tensors share no memory."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 + a.numel() * a.element_size() <= b0 or b0 + b.numel() * b.element_size() <= a0


def _glu_backward_in_place(ctx, dc):
    """The backward of ``in_place_backward=True``: the gradients written over the saved gate and up, which the MLP
    made for this kernel alone and nothing reads after it. Its two [tokens, intermediate] outputs are the largest
    allocation of a decoder layer's backward, where a deep model's step peaks (liger's SwiGLU writes them in
    place too). Their versions move on, so a second backward through this graph raises instead of reading
    gradients as activations."""
    gate, up = ctx.saved_tensors
    kind, gate_multiplier, down_multiplier, backend = ctx.args
    # a leaf (a parameter, a user's tensor) is read after the backward: never written over
    own = not (gate.is_leaf or up.is_leaf) and _disjoint(gate, up)
    fits = backend == "triton" and gate.is_contiguous() and up.is_contiguous() and own
    if not fits:
        return _glu_backward(ctx, dc)
    tk.launch_glu_bwd(dc, gate, up, kind, gate_multiplier, down_multiplier, out=(gate, up))
    torch.autograd.graph.increment_version((gate, up))
    return gate, up, None, None, None, None


glu_fwd = define_op("glu_fwd", _glu_fwd_impl, setup=_glu_setup, backward=_glu_backward)
# The same op with the in-place backward, eager only: an AOT-traced backward may not mutate its saved inputs
_glu_fwd_in_place_backward = eager_twin(
    "glu_fwd_in_place_backward", _glu_fwd_impl, _glu_setup, _glu_backward_in_place
)


def _glu_triton(kind: int, gate, up, gate_multiplier, down_multiplier, in_place_backward: bool):
    args = (gate, up, kind, float(gate_multiplier), float(down_multiplier), "triton")
    if in_place_backward and not torch.compiler.is_compiling():
        return _glu_fwd_in_place_backward.apply(*args)
    return glu_fwd(*args)


def swiglu_triton(gate, up, gate_multiplier=1.0, down_multiplier=1.0, in_place_backward=False):
    return _glu_triton(tk.SILU, gate, up, gate_multiplier, down_multiplier, in_place_backward)


def geglu_triton(gate, up, gate_multiplier=1.0, down_multiplier=1.0, in_place_backward=False):
    return _glu_triton(tk.GELU_TANH, gate, up, gate_multiplier, down_multiplier, in_place_backward)


# ---------------------------------------------------------------- gated activations over a fused gate_up, relu²
# Triton only (no backend argument: their torch path is the reference function under autograd), so the fakes
# are given.
def _gate_up_fwd_impl(gate_up: Tensor, kind: str, limit: float, alpha: float) -> Tensor:
    return tk.launch_gate_up_fwd(gate_up, kind, limit, alpha)


def _gate_up_fwd_fake(gate_up, kind, limit, alpha):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def _gate_up_bwd_impl(dout: Tensor, gate_up: Tensor, kind: str, limit: float, alpha: float) -> Tensor:
    return tk.launch_gate_up_bwd(dout, gate_up, kind, limit, alpha)


def _gate_up_bwd_fake(dout, gate_up, kind, limit, alpha):
    return gate_up.new_empty(gate_up.shape)


gate_up_bwd = define_op("gate_up_bwd", _gate_up_bwd_impl, fake=_gate_up_bwd_fake)


def _gate_up_setup(ctx, inputs, output):
    gate_up, kind, limit, alpha = inputs
    ctx.save_for_backward(gate_up)
    ctx.args = (kind, limit, alpha)


def _gate_up_backward(ctx, dout):
    (gate_up,) = ctx.saved_tensors
    return gate_up_bwd.from_backward(ctx, dout, gate_up, *ctx.args), None, None, None


gate_up_fwd = define_op(
    "gate_up_fwd", _gate_up_fwd_impl, setup=_gate_up_setup, backward=_gate_up_backward, fake=_gate_up_fwd_fake
)


def _relu_squared_impl(x: Tensor, dy: Tensor | None) -> Tensor:
    """``relu(x) ** 2`` or, given ``dy``, its gradient ``2 * relu(x) * dy``: one op for both passes."""
    return tk.launch_relu_squared(x, dy)


def _relu_squared_fake(x, dy):
    return x.new_empty(x.shape)


def _relu_squared_setup(ctx, inputs, output):
    x, dy = inputs
    ctx.save_for_backward(x)
    ctx.is_gradient = dy is not None


def _relu_squared_backward(ctx, dout):
    if ctx.is_gradient:
        raise NotImplementedError("relu_squared: no double backward")
    (x,) = ctx.saved_tensors
    return relu_squared_op.from_backward(ctx, x, dout), None


relu_squared_op = define_op(
    "relu_squared",
    _relu_squared_impl,
    setup=_relu_squared_setup,
    backward=_relu_squared_backward,
    fake=_relu_squared_fake,
)


def glu_fused_triton(gate_up: Tensor, kind: str = "swiglu") -> Tensor:
    return gate_up_fwd(gate_up, kind, 0.0, 0.0)


def swiglu_clamped_triton(gate_up: Tensor, limit: float, alpha: float) -> Tensor:
    return gate_up_fwd(gate_up, "clamped_swiglu", float(limit), float(alpha))


def relu_squared_triton(x: Tensor) -> Tensor:
    return relu_squared_op(x, None)


SWIGLU = register(Op("swiglu", torch_impl=ref.swiglu_torch, triton_impl=swiglu_triton))
GEGLU = register(Op("geglu", torch_impl=ref.geglu_torch, triton_impl=geglu_triton))
GLU_FUSED = register(Op("glu_fused", torch_impl=ref.glu_fused_torch, triton_impl=glu_fused_triton))
SWIGLU_CLAMPED = register(
    Op("swiglu_clamped", torch_impl=ref.swiglu_clamped_torch, triton_impl=swiglu_clamped_triton)
)
RELU_SQUARED = register(
    Op("relu_squared", torch_impl=ref.relu_squared_torch, triton_impl=relu_squared_triton)
)
