"""``torch.library`` custom ops (namespace ``liger_registry``) wrapping the Triton kernels.

Each op has a fake (meta) implementation and a registered autograd formula, so ``torch.compile`` treats it
as one opaque node without a graph break. Each op takes the backend decided by its ``Op`` (``"triton"`` or
``"torch"``) as its last argument and does not decide again; with ``"torch"`` it runs the PyTorch formulas, so a
direct call of ``torch.ops.liger_registry.*`` works everywhere.

Layouts: a fake gives exactly the shape, dtype and strides of its op's outputs on both backends (inductor
asserts them). RoPE keeps its input's layout (see ``rope``). The norm and GLU ops are in ``kernels.norm`` and
``kernels.glu``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import torch_impl, triton_rope
from .triton_rope_variants import rope_out_like

NS = "liger_registry"


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


# ---------------------------------------------------------------- RoPE
# Outputs keep the layout of q / k (``rope_out_like``), as HF's function does: attention passes transposed views
# of its projections, and what follows (the attention kernel, the KV cache, a seq-first family's transpose back)
# sees the layout it sees unpatched. The kernel writes fresh outputs in any layout at no cost; the torch branch's
# result is put in that layout when it differs.
def _in_rope_layout(result: Tensor, x: Tensor) -> Tensor:
    out = rope_out_like(x, result.dtype)
    return result if out.stride() == result.stride() else out.copy_(result)


def _rope_op_impl(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, backward: bool, backend: str
) -> tuple[Tensor, Tensor]:
    if backend == "torch":
        fn = torch_impl.rope_bwd_torch if backward else torch_impl.rope_torch  # backward: q, k are the grads
        q_out, k_out = fn(q, k, cos, sin)
        return _in_rope_layout(q_out, q), _in_rope_layout(k_out, k)
    return triton_rope.rope_apply(q, k, cos, sin, backward=backward)


rope_op = torch.library.custom_op(f"{NS}::rope", _rope_op_impl, mutates_args=())


@rope_op.register_fake
def _(q, k, cos, sin, backward, backend):
    if backward:  # the gradients keep their own dtypes
        return rope_out_like(q, q.dtype), rope_out_like(k, k.dtype)
    return (
        rope_out_like(q, torch.promote_types(q.dtype, cos.dtype)),
        rope_out_like(k, torch.promote_types(k.dtype, cos.dtype)),
    )


def _rope_setup(ctx, inputs, output):
    q, k, cos, sin, _, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.backend = backend
    ctx.dtypes = (q.dtype, k.dtype)
    ctx.shapes = (q.shape, k.shape)


def _rope_backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    if dq is None:  # an unused output (grads are not materialised on the eager path)
        dq = cos.new_zeros(ctx.shapes[0], dtype=ctx.dtypes[0])
    if dk is None:
        dk = cos.new_zeros(ctx.shapes[1], dtype=ctx.dtypes[1])
    fn = _rope_op_impl if getattr(ctx, "eager", False) else rope_op
    gq, gk = fn(dq, dk, cos, sin, True, ctx.backend)
    return gq.to(ctx.dtypes[0]), gk.to(ctx.dtypes[1]), None, None, None, None


torch.library.register_autograd(f"{NS}::rope", _rope_backward, setup_context=_rope_setup)


_RopeFn = _eager_function("_RopeFn", _rope_op_impl, _rope_setup, _rope_backward)


def rope_triton(q, k, cos, sin):
    return _call(rope_op, _RopeFn, q, k, cos, sin, False, "triton")
