"""The RoPE custom ops ``liger_registry::rope`` and ``liger_registry::rope_variant``, and their backend Ops.

* :func:`rotate`: the one implementation of both ops (forward, and the transposed rotation as the backward),
  ``reference.rotate_torch`` or ``triton_kernels.launch_rotate`` by its backend argument.
* ``ROPE_OP`` (full-width rotate-half) / ``ROPE_VARIANT_OP`` (every layout): the ``define_op`` definitions;
  ``ROPE`` / ``ROPE_VARIANT``: the registered backend Ops.
* Outputs keep the layout of q / k (``rope_out_like``), as HF's function does: attention passes transposed views
  of its projections, and what follows (the attention kernel, the KV cache, a seq-first family's transpose
  back) sees the layout it sees unpatched. The torch branch's result is put in that layout when it differs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..backend import Op, register
from ..define import define_op
from . import reference, triton_kernels


def rotate(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    rotary_dim: int,
    interleaved: bool,
    cos_per_pair: bool,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype,
    backward: bool,
    backend: str,
) -> tuple[Tensor, Tensor]:
    """The one implementation of both ops: ``backward`` rotates the gradients by the transposed rotation.
    cos/sin: [batch or 1, seq, C] or [seq, C], at least as wide as the rotation reads."""
    if cos.shape != sin.shape:
        raise ValueError("rope: cos and sin shapes differ")
    cos, sin = reference.rope_table(cos, sin, rotary_dim, cos_per_pair)
    opts = (rotary_dim, interleaved, cos_per_pair, q_dtype, k_dtype, backward)
    if backend == "torch":
        return reference.rotate_torch(q, k, cos, sin, *opts)
    return triton_kernels.launch_rotate(q, k, cos, sin, *opts)


def _rope_impl(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, backward: bool, backend: str
) -> tuple[Tensor, Tensor]:
    # backward: q, k are the gradients, which keep their own dtypes
    q_dtype, k_dtype = reference.out_dtypes(q, k, cos, keep=backward)
    rot, per_pair = reference.plain_layout(q.shape[-1], cos.shape[-1])
    return rotate(q, k, cos, sin, rot, False, per_pair, q_dtype, k_dtype, backward, backend)


def _variant_impl(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    rotary_dim: int,
    interleaved: bool,
    cos_per_pair: bool,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype,
    backward: bool,
) -> tuple[Tensor, Tensor]:
    return rotate(q, k, cos, sin, rotary_dim, interleaved, cos_per_pair, q_dtype, k_dtype, backward, "triton")


def _variant_fake(*args):
    return rotate(*args, "torch")


def _setup(ctx, inputs, output):
    q, k, cos, sin, *options = inputs
    ctx.save_for_backward(cos, sin)
    ctx.inputs = ((q.shape, q.dtype), (k.shape, k.dtype))
    ctx.options = options


def _grads(ctx, dq, dk, like: Tensor) -> tuple[Tensor, Tensor]:
    """The output gradients, zeros (on ``like``'s device) for an unused output (not materialised on the eager
    path)."""
    return tuple(
        g if g is not None else like.new_zeros(shape, dtype=dtype)
        for g, (shape, dtype) in zip((dq, dk), ctx.inputs, strict=True)
    )


# ctx.saved_tensors is read once per backward: non-reentrant activation checkpointing unpacks each saved tensor
# at most once and raises on a second read
def _rope_backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    gq, gk = ROPE_OP.from_backward(ctx, *_grads(ctx, dq, dk, cos), cos, sin, True, ctx.options[-1])
    (_, q_dtype), (_, k_dtype) = ctx.inputs
    return gq.to(q_dtype), gk.to(k_dtype), None, None, None, None


def _variant_backward(ctx, dq, dk):
    (_, q_dtype), (_, k_dtype) = ctx.inputs
    layout = ctx.options[:3]
    cos, sin = ctx.saved_tensors
    grads = ROPE_VARIANT_OP.from_backward(
        ctx, *_grads(ctx, dq, dk, cos), cos, sin, *layout, q_dtype, k_dtype, True
    )
    return (*grads, *(None,) * 8)


ROPE_OP = define_op("rope", _rope_impl, setup=_setup, backward=_rope_backward)
# rope_variant's schema has no backend argument (it always runs Triton): its fake is the torch branch, as derived
ROPE_VARIANT_OP = define_op(
    "rope_variant", _variant_impl, setup=_setup, backward=_variant_backward, fake=_variant_fake
)


def rope_triton(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return ROPE_OP(q, k, cos, sin, False, "triton")


def rope_variant_triton(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved=False,
    cos_per_pair=False,
    upcast=False,
    rotary_dim=None,
) -> tuple[Tensor, Tensor]:
    rot = reference.rotary_dim_of(cos, cos_per_pair) if rotary_dim is None else rotary_dim
    q_dtype, k_dtype = reference.out_dtypes(q, k, cos, keep=upcast)
    return ROPE_VARIANT_OP(q, k, cos, sin, rot, interleaved, cos_per_pair, q_dtype, k_dtype, False)


ROPE = register(Op("rope", torch_impl=reference.rope_torch, triton_impl=rope_triton))
ROPE_VARIANT = register(
    Op("rope_variant", torch_impl=reference.rope_variant_torch, triton_impl=rope_variant_triton)
)
