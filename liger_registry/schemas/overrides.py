"""Keyword overrides of `apply(...)`: one per kernel kind (on/off) plus the head's knobs, each with its knob path."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, create_model

from liger_registry.limits import LAYERED_OPTIONS, ChunkConst
from liger_registry.schemas.base import StrictModel
from liger_registry.schemas.family import SkipLogitsMode
from liger_registry.schemas.kernel_kinds import CE_KEY, FLCE_KEY, KINDS

# Knobs that are not a kernel kind's on/off switch: (knob path, type, field options).
HEAD_OVERRIDES: dict[str, tuple[str, Any, dict[str, Any]]] = {
    FLCE_KEY: ("flce.enabled", StrictBool | None, {}),
    CE_KEY: ("cross_entropy.enabled", StrictBool | None, {}),
    **{o.keyword or o.name: (f"flce.{o.name}", o.schema | None, {}) for o in LAYERED_OPTIONS},
    "jsd_chunk_mem_const": ("fused_linear_jsd.chunk_mem_const", ChunkConst | None, {}),
    "skip_logits": ("skip_logits", SkipLogitsMode | None, {}),
}

OVERRIDE_PATHS: dict[str, str] = {
    **{name: f"kernels.{name}.enabled" for name in KINDS},
    **{name: path for name, (path, _, _) in HEAD_OVERRIDES.items()},
}

Overrides = create_model(
    "Overrides",
    __base__=StrictModel,
    __doc__="Keyword overrides of `apply(...)`; an unknown name is an error, never dropped.",
    **{name: (StrictBool | None, Field(None, description=f"Install the {name} kernel.")) for name in KINDS},
    **{
        name: (annotation, Field(None, description=f"Sets {path}.", **options))
        for name, (path, annotation, options) in HEAD_OVERRIDES.items()
    },
)

# The `liger_kernel_config` keys (TrainingArguments) accepted as overrides: the kinds' keys, then the head's.
LIGER_KEYS: tuple[str, ...] = (*(k.liger_key for k in KINDS.values() if k.liger_key), CE_KEY, FLCE_KEY)
# The on/off switch each override name turns: knob path -> name (`kernels.rope.enabled` -> rope).
SWITCHES: dict[str, str] = {path: name for name, path in OVERRIDE_PATHS.items() if path.endswith(".enabled")}
