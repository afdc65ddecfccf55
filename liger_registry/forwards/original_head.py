"""The forward for heads that cannot be fused: the original computes logits and loss; skip_logits is owned here."""

from __future__ import annotations

from typing import Any

from liger_registry.forwards.context import ForwardContext
from liger_registry.forwards.logits_loss import cross_entropy_loss
from liger_registry.forwards.registry import register_forward
from liger_registry.forwards.skip_logits import resolve_skip_logits


def _without_logits(outputs: Any) -> Any:
    return type(outputs)(**{k: v for k, v in outputs.items() if k != "logits"})


def _without_labels(ctx: ForwardContext, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's arguments with `labels` None, wherever it was passed (by name or by position)."""
    if "labels" in kwargs:
        return args, {**kwargs, "labels": None}
    at = list(ctx.signature.parameters).index("labels") - 1  # after self
    return (*args[:at], None, *args[at + 1 :]) if at < len(args) else args, kwargs


@register_forward(
    "original_head",
    "The original forward (logits and loss as transformers computes them, never fused); skip_logits owned on top.",
    fuses=False,
)
def original_head(model, ctx: ForwardContext, *args, skip_logits: bool | None = None, **kwargs):
    """For heads that FLCE cannot take (llama4's multimodal head computes its loss from logits itself).

    skip_logits follows the documented contract for a forward that does not fuse: True without labels raises,
    True (or None under a `labels` default) returns the loss and no logits, otherwise the logits come back.
    With the family's cross_entropy switch on, the original runs without labels and the loss of its logits is
    transformers' causal-LM loss by the cross-entropy kernel.
    """
    from liger_registry.forwards.causal_lm import IGNORE_INDEX, as_tuple, next_token_labels

    named, extra = ctx.bind(model, args, kwargs)
    labels = named.get("labels")
    has_labels = labels is not None or extra.get("shift_labels") is not None
    skip = resolve_skip_logits(skip_logits, ctx.entry.skip_logits, model.training, has_labels, fuses=False)
    tuple_out = named.get("return_dict") is False
    if tuple_out:
        kwargs = {**kwargs, "return_dict": True}
    by_kernel = ctx.entry.cross_entropy.enabled and labels is not None
    if by_kernel:
        args, kwargs = _without_labels(ctx, args, kwargs)
    outputs = ctx.original(model, *args, **kwargs)
    if by_kernel:
        ignore_index = extra.get("ignore_index", IGNORE_INDEX)
        loss = cross_entropy_loss(
            outputs.logits, next_token_labels(labels, extra), ignore_index, extra.get("num_items_in_batch")
        )
        outputs = type(outputs)(**{**outputs, "loss": loss})
    if skip:
        outputs = _without_logits(outputs)
    if not tuple_out:
        return outputs
    return as_tuple(outputs) if skip else outputs.to_tuple()
