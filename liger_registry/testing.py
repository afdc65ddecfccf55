"""Tiny random-weight models of a family, built from its config with no download (lint --deep, parity)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from liger_registry.registry.loader import Registry, load_registry

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
    known = config.to_dict()
    for key, value in {**{k: v for k, v in SMALL.items() if k in known}, **entry.tiny_config, **overrides}.items():
        setattr(config, key, value)
    return config


def tiny_model(model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32, registry: Registry | None = None, **overrides: Any):
    """A randomly initialised causal LM of the family, on CPU."""
    config = tiny_config(model_type, registry, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def tiny_batch(model, batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": torch.ones_like(input_ids)}
