"""The loss ops' hand-built eager twins (``kernels.define`` is the pattern every other op uses)."""

from __future__ import annotations

import torch

from .define import NS

__all__ = ["NS", "_call", "_eager_function"]


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
