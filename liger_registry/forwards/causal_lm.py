"""The causal-LM forwards (dense and MoE): base model, then fused linear cross entropy or logits."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from liger_registry import kernels
from liger_registry.attr_path import read_path, text_config
from liger_registry.constants import IGNORE_INDEX
from liger_registry.forwards.context import ForwardContext
from liger_registry.forwards.head import (
    call_fused_head,
    logit_transform,
    postprocess_logits,
    warn_unfusable,
)
from liger_registry.forwards.logits_loss import changes_the_loss, cross_entropy_loss, logits_loss
from liger_registry.forwards.positions import (
    DEFAULT_POSITIONS,
    default_positions_call,
)
from liger_registry.forwards.registry import register_forward
from liger_registry.forwards.skip_logits import resolve_skip_logits

HEAD_ONLY = ("labels", "logits_to_keep", "return_dict")
# Keywords the head reads and the decoder never sees: liger's `return_token_accuracy` (older TRL's SFTTrainer
# passes it and reads `outputs.token_accuracy`), and TRL's `fused_lm_head` (see _refuse_trl_fused_head).
HEAD_EXTRA = ("return_token_accuracy", "fused_lm_head")


def _slice(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    index = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden[:, index, :]


def next_token_labels(labels, extra: dict) -> torch.Tensor:
    shift_labels = extra.get("shift_labels")
    if shift_labels is not None:
        return shift_labels
    # the slot past the end is padded with the caller's ignore_index, as HF's ForCausalLMLoss does: with a constant
    # -100 a custom ignore_index would turn that slot into a real (out-of-range) label
    return F.pad(labels, (0, 1), value=extra.get("ignore_index", IGNORE_INDEX))[..., 1:]


def fused_loss(model: Any, ctx: ForwardContext, hidden: torch.Tensor, labels, extra: dict):
    """The training loss by FLCE, with HF's shift and num_items_in_batch semantics (sum, then divide).

    None when the head cannot be fused; `(loss, token_accuracy)` when `return_token_accuracy` is asked.
    """
    head = ctx.entry.head
    shift_labels = next_token_labels(labels, extra)
    num_items = extra.get("num_items_in_batch")
    softcap, scale = logit_transform(
        text_config(model.config, head.text_config_attr),
        head.softcap_attr,
        head.logit_scale_attr,
        head.logit_multiplier_attr,
    )
    accuracy = bool(extra.get("return_token_accuracy"))
    options = dataclasses.replace(
        ctx.flce_options,
        softcap=softcap,
        logit_scale=scale,
        reduction="mean" if num_items is None else "sum",
        ignore_index=extra.get("ignore_index", IGNORE_INDEX),
    )

    def compute(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        target = shift_labels.reshape(-1).to(h.device)
        return kernels.fused_linear_cross_entropy(
            h.reshape(-1, h.shape[-1]), weight, target, bias, options=options, return_token_accuracy=accuracy
        )

    result = call_fused_head(getattr(model, head.lm_head), hidden, compute)
    if result is None:
        return None
    loss = result.loss if accuracy else result
    if num_items is not None:
        loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    return (loss, result.token_accuracy) if accuracy else loss


def _token_accuracy(logits: torch.Tensor, labels, extra: dict) -> torch.Tensor:
    """Fraction of non-ignored next-token labels that are the argmax of the logits (liger's token_accuracy)."""
    target = next_token_labels(labels, extra).to(logits.device)
    valid = target != extra.get("ignore_index", IGNORE_INDEX)
    correct = (logits.detach().argmax(-1) == target) & valid
    return correct.sum().float() / valid.sum().clamp(min=1)


def _refuse_trl_fused_head(extra: dict) -> None:
    if extra.get("fused_lm_head"):
        raise ValueError(
            "liger_registry: this forward got `fused_lm_head=True` (TRL's fused-head convention), but the model's "
            "forward is liger_registry's, not TRL's fused head: TRL's head was never installed on this model or "
            "was taken off. Build the TRL trainer on the model you train (apply() keeps TRL's head and installs "
            "the decoder kernels under it), or leave `use_liger_kernel` off and let liger_registry fuse the head."
        )


def head_and_loss(model: Any, ctx: ForwardContext, outputs: Any, named: dict, extra: dict, skip_logits):
    """(loss, logits) from the decoder's last hidden state, following skip_logits."""
    labels = named.get("labels")
    has_labels = labels is not None or extra.get("shift_labels") is not None
    fuses = ctx.entry.flce.enabled
    skip = resolve_skip_logits(skip_logits, ctx.entry.skip_logits, model.training, has_labels, fuses=fuses)
    logits_to_keep = named.get("logits_to_keep", ctx.default("logits_to_keep") or 0)
    hidden = _slice(outputs.last_hidden_state, logits_to_keep)
    head_extra = {k: extra.pop(k) for k in HEAD_EXTRA if k in extra}
    accuracy = bool(head_extra.get("return_token_accuracy")) and has_labels
    if skip and fuses:
        fused = fused_loss(model, ctx, hidden, labels, {**extra, "return_token_accuracy": accuracy})
        if fused is not None:
            if accuracy:
                named["token_accuracy"] = fused[1]
                return fused[0], None
            return fused, None
        warn_unfusable(getattr(model, ctx.entry.head.lm_head))
        skip = resolve_skip_logits(
            skip_logits, ctx.entry.skip_logits, model.training, has_labels, fuses=False
        )
    head = ctx.entry.head
    config = text_config(model.config, head.text_config_attr)
    logits = postprocess_logits(
        getattr(model, head.lm_head)(hidden),
        *logit_transform(config, head.softcap_attr, head.logit_scale_attr, head.logit_multiplier_attr),
    )
    loss = None
    if has_labels:
        loss = materialised_loss(model, ctx, logits, labels, extra, config.vocab_size)
    if accuracy:
        named["token_accuracy"] = _token_accuracy(logits, labels, extra)
    return loss, (None if skip else logits)


def materialised_loss(
    model: Any, ctx: ForwardContext, logits: torch.Tensor, labels, extra: dict, vocab_size: int
):
    """The loss of materialised logits: the FLCE options' loss where they change it (as the fused path), else the
    cross-entropy kernel when the family's cross_entropy switch is on, else the model's own loss function."""
    ignore_index = extra.get("ignore_index", IGNORE_INDEX)
    if changes_the_loss(ctx.flce_options):
        options = dataclasses.replace(ctx.flce_options, ignore_index=ignore_index)
        return logits_loss(logits, next_token_labels(labels, extra), options, extra.get("num_items_in_batch"))
    if ctx.entry.cross_entropy.enabled:
        return cross_entropy_loss(
            logits, next_token_labels(labels, extra), ignore_index, extra.get("num_items_in_batch")
        )
    return model.loss_function(logits=logits, labels=labels, vocab_size=vocab_size, **extra)


def _base_call(model: Any, ctx: ForwardContext, named: dict, extra: dict) -> Any:
    _refuse_trl_fused_head(extra)
    base_args = {k: v for k, v in named.items() if k not in HEAD_ONLY}
    base_kwargs = {k: v for k, v in extra.items() if k not in HEAD_EXTRA}
    base = getattr(model, ctx.entry.head.base_model)
    takes = ctx.takes_default_positions
    if takes is not None and takes(base) and default_positions_call(base_args, base_kwargs):
        base_kwargs[DEFAULT_POSITIONS] = True
    return base(**base_args, **base_kwargs)


def _output(ctx: ForwardContext, outputs: Any, named: dict, **fields: Any) -> Any:
    names = ctx.output_class.__dataclass_fields__
    values = {name: getattr(outputs, name, None) for name in names if name not in fields}
    values.update({k: v for k, v in fields.items() if k in names})
    result = ctx.output_class(**values)
    if named.get("token_accuracy") is not None:
        result["token_accuracy"] = named["token_accuracy"]  # a ModelOutput item and attribute, as liger's
    return result if named.get("return_dict", True) is not False else as_tuple(result)


def as_tuple(output: Any) -> tuple:
    """The output as transformers' `to_tuple()` (None values left out), except `logits`: None where the forward
    skipped them, so each value keeps its position (`out[1]` is the logits or None, never the cache)."""
    fields = [k for k in output.__dataclass_fields__ if k == "logits" or output.get(k) is not None]
    extra = [k for k in output.keys() if k not in fields]  # e.g. token_accuracy, set as an item
    return tuple(output.get(k) for k in fields + extra)


@register_forward("causal_lm", "Dense causal LM: decoder, then FLCE (no logits) or lm_head logits + HF loss.")
def causal_lm(model, ctx: ForwardContext, *args, skip_logits: bool | None = None, **kwargs):
    named, extra = ctx.bind(model, args, kwargs)
    outputs = _base_call(model, ctx, named, extra)
    loss, logits = head_and_loss(model, ctx, outputs, named, extra, skip_logits)
    return _output(ctx, outputs, named, loss=loss, logits=logits)


def _moe_constant(model: Any, config: Any, *names: str) -> Any:
    """An MoE constant as the original reads it: the ForCausalLM's own attribute, else the (text) config's
    (a name, or a dotted path into a nested config)."""
    value = read_path(model, names[0])
    for name in names:
        value = read_path(config, name) if value is None else value
    if value is None:
        raise AttributeError(f"liger_registry: neither the model nor its config has {' or '.join(names)}")
    return value


@register_forward(
    "causal_lm_moe",
    "MoE causal LM: as causal_lm, plus the router load-balancing loss as HF adds it.",
    moe=True,
)
def causal_lm_moe(model, ctx: ForwardContext, *args, skip_logits: bool | None = None, **kwargs):
    named, extra = ctx.bind(model, args, kwargs)
    config = text_config(model.config, ctx.entry.head.text_config_attr)
    # A named parameter of the original, or (some multimodal heads) one of its **kwargs.
    router = named if "output_router_logits" in ctx.signature.parameters else extra
    if ctx.router_logits_from_config and router.get("output_router_logits") is None:
        router["output_router_logits"] = getattr(config, "output_router_logits", False)
    outputs = _base_call(model, ctx, named, extra)
    loss, logits = head_and_loss(model, ctx, outputs, named, extra, skip_logits)
    aux_loss = None
    if router.get("output_router_logits"):
        moe = ctx.entry.head.moe
        aux_loss = getattr(ctx.module, moe.aux_loss_function)(
            outputs.router_logits,
            _moe_constant(model, config, *moe.num_experts_attrs),
            _moe_constant(model, config, moe.top_k_attr),
            named.get("attention_mask"),
        )
        if loss is not None:
            loss = loss + _moe_constant(model, config, moe.coefficient_attr) * aux_loss.to(loss.device)
    return _output(ctx, outputs, named, loss=loss, logits=logits, aux_loss=aux_loss)
