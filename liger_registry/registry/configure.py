"""From a model (through its wrappers) or a model type to its family's resolved configuration; patches nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from liger_registry.registry.errors import PatchError
from liger_registry.registry.loader import Registry, load_registry
from liger_registry.registry.resolve import ResolvedConfig, resolve

_MODULE_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "DeepSpeedEngine")


def unwrap_model(model: Any) -> Any:
    """The transformers model inside torch.compile, PEFT (get_base_model), DDP/DataParallel, FSDP1 and DeepSpeed
    engine wrappers."""
    for _ in range(8):
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif callable(getattr(model, "get_base_model", None)) and type(model).__module__.startswith("peft."):
            model = model.get_base_model()
        elif type(model).__name__ in _MODULE_WRAPPERS and callable(getattr(model, "module", None)):
            model = model.module
        else:
            break
    return model


def model_type_of(model: Any) -> str:
    """`config.model_type` of the transformers model inside any wrapper; PatchError when there is none."""
    inner = unwrap_model(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    if not model_type:
        raise PatchError(f"{type(inner).__name__} has no config.model_type: is it a transformers model?")
    return model_type


def configure(
    model_or_model_type: Any,
    policy: str | Path | list | None = None,
    registry: Registry | None = None,
    **overrides: Any,
) -> ResolvedConfig:
    """The resolved configuration (layers 1-5) of the family serving this model or model type."""
    registry = registry or load_registry()
    target = (
        model_or_model_type if isinstance(model_or_model_type, str) else model_type_of(model_or_model_type)
    )
    return resolve(registry, registry.family_for(target), policy, overrides)
