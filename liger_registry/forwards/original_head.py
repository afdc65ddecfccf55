"""The forward for heads that cannot be fused: the original computes logits and loss; skip_logits is owned here."""

from __future__ import annotations

from typing import Any

from liger_registry.forwards.context import ForwardContext
from liger_registry.forwards.registry import register_forward
from liger_registry.forwards.skip_logits import resolve_skip_logits


def _without_logits(outputs: Any) -> Any:
    return type(outputs)(**{k: v for k, v in outputs.items() if k != "logits"})


@register_forward(
    "original_head",
    "The original forward (logits and loss as transformers computes them, never fused); skip_logits owned on top.",
    fuses=False,
)
def original_head(model, ctx: ForwardContext, *args, skip_logits: bool | None = None, **kwargs):
    """For heads that FLCE cannot take (llama4's multimodal head computes its loss from logits itself).

    skip_logits follows the documented contract for a forward that does not fuse: True without labels raises,
    True (or None under a `labels` default) returns the loss and no logits, otherwise the logits come back.
    """
    named, extra = ctx.bind(model, args, kwargs)
    has_labels = named.get("labels") is not None or extra.get("shift_labels") is not None
    skip = resolve_skip_logits(skip_logits, ctx.entry.skip_logits, model.training, has_labels, fuses=False)
    tuple_out = named.get("return_dict") is False
    if tuple_out:
        kwargs = {**kwargs, "return_dict": True}
    outputs = ctx.original(model, *args, **kwargs)
    if skip:
        outputs = _without_logits(outputs)
    if not tuple_out:
        return outputs
    from liger_registry.forwards.causal_lm import as_tuple

    return as_tuple(outputs) if skip else outputs.to_tuple()
