"""liger-kernel's `AutoLigerKernelForCausalLM`: `AutoModelForCausalLM` that patches the model it loads.

The kernel switches among the keyword arguments (`rope=False`, ...) go to `apply`; the rest to transformers.
Unlike the reference, which patches the model type's classes for the whole process before loading, this patches
the loaded instance only, and an unsupported model type is an error raised before any weight is read.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

import liger_registry
from liger_registry.compat.entry_points import BY_MODEL_TYPE, SWITCHES, switches_for, to_overrides

FUNCTION = "AutoLigerKernelForCausalLM"


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kernel switches, everything else)."""
    return (
        {k: v for k, v in kwargs.items() if k in SWITCHES},
        {k: v for k, v in kwargs.items() if k not in SWITCHES},
    )


def _checked(model_type: str, switches: dict[str, Any]) -> dict[str, Any]:
    """The `apply` overrides of the switches, once the model type is known to be served and they are ones it
    takes (before loading)."""
    liger_registry.load_registry().family_for(model_type)  # UnsupportedModelError naming the served types
    switches = switches_for(model_type, switches, FUNCTION)
    return to_overrides(FUNCTION, BY_MODEL_TYPE.get(model_type), model_type, switches)


class AutoLigerKernelForCausalLM(AutoModelForCausalLM):
    """`from_pretrained` / `from_config` load as `AutoModelForCausalLM` does, then `apply` the switches given."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        switches, rest = _split(kwargs)
        config = rest.get("config")
        if not isinstance(config, PretrainedConfig):
            config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **rest)
        switches = _checked(config.model_type, switches)
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **rest)
        liger_registry.apply(model, **switches)
        return model

    @classmethod
    def from_config(cls, config, **kwargs):
        switches, rest = _split(kwargs)
        switches = _checked(config.model_type, switches)
        model = super().from_config(config, **rest)
        liger_registry.apply(model, **switches)
        return model
