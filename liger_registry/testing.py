"""Tiny random-weight models of a family, built from its config with no download (lint --deep, parity)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from liger_registry.registry.loader import Registry, load_registry
from liger_registry.registry.targets import resolve_class

SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}


def tiny_config(model_type: str, registry: Registry | None = None, **overrides: Any):
    """The family's config with small sizes: SMALL, then the entry's tiny_config, then overrides.

    Only keys the model type's config already has are taken from SMALL, so no family gets an
    attribute its config does not know.
    """
    registry = registry or load_registry()
    entry = registry.family_for(model_type).entry
    config = AutoConfig.for_model(model_type)
    configs = [config] + ([config.get_text_config()] if config.get_text_config() is not config else [])
    for sub in configs:  # a multimodal config's language model gets the small sizes too
        known = sub.to_dict()
        _update(sub, {k: v for k, v in SMALL.items() if k in known})
    _update(config, {**entry.tiny_config, **overrides})
    return config


def _update(config: PretrainedConfig, values: dict[str, Any]) -> None:
    """Set config values; a dict for a nested config (text_config, vision_config) updates that config."""
    for key, value in values.items():
        try:
            current = getattr(config, key, None)
        except RuntimeError:  # a per-layer attribute of a heterogeneous config (Gemma 4) has no global value
            current = None
        if isinstance(value, dict) and isinstance(current, PretrainedConfig):
            _update(current, value)
        else:
            setattr(config, key, value)


def tiny_model(
    model_type: str,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    registry: Registry | None = None,
    **overrides: Any,
):
    """A randomly initialised model of the family's `causal_lm` class (the head FLCE patches), on CPU."""
    registry = registry or load_registry()
    config = tiny_config(model_type, registry, **overrides)
    entry = registry.family_for(model_type).entry
    torch.manual_seed(seed)
    return resolve_class(entry, entry.causal_lm)._from_config(config, dtype=dtype)


def tiny_batch(model, batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": torch.ones_like(input_ids)}
