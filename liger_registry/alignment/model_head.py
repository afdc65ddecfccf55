"""The fused head of a transformers causal LM: its last hidden states, head weight and bias, and the logit
transform its family applies, read through the registry entry (what a loss needs instead of the logits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from liger_registry.attr_path import text_config
from liger_registry.forwards.head import head_parameters, logit_transform
from liger_registry.registry.configure import configure, unwrap_model
from liger_registry.registry.loader import Registry
from liger_registry.schemas import FamilyEntry


class ModelHead(NamedTuple):
    """``hidden`` [B, T, H], ``weight`` [V, H], ``bias`` [V] or None, and ``options``: the ``softcap`` and
    ``logit_scale`` keyword arguments of every alignment loss, as the family's forward applies them."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    options: dict[str, Any]


def model_head(model: Any, inputs: Mapping[str, Any], registry: Registry | None = None) -> ModelHead:
    """Runs the decoder of ``model`` (any wrapper: PEFT, DDP, torch.compile) on ``inputs`` (input_ids,
    attention_mask, ...; no labels) and returns what the fused head needs. A family the registry does not know,
    or a head that is not one linear projection (e.g. LoRA with dropout in training), is a ValueError."""
    return head_of(model, configure(model, None, registry).entry, inputs)


def head_of(model: Any, entry: FamilyEntry, inputs: Mapping[str, Any]) -> ModelHead:
    """:func:`model_head` of a model whose family entry is already resolved (with its policies and overrides)."""
    head = entry.head
    if head is None:
        raise ValueError(f"family {entry.family!r} has no causal-LM head: there is nothing to fuse")
    inner = unwrap_model(model)
    outputs = getattr(inner, head.base_model)(**inputs)
    hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
    params = head_parameters(getattr(inner, head.lm_head))
    if params is None:
        raise ValueError(
            f"{type(inner).__name__}: the lm_head is not one linear projection the fused head can read"
        )
    config = text_config(inner.config, head.text_config_attr)
    softcap, scale = logit_transform(
        config, head.softcap_attr, head.logit_scale_attr, head.logit_multiplier_attr
    )
    hidden = hidden.to(params[0].device)
    return ModelHead(hidden, params[0], params[1], {"softcap": softcap, "logit_scale": scale})
