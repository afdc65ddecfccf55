"""Turns a Hugging Face `liger_kernel_config` dict (TrainingArguments) into liger_registry keyword overrides."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from liger_registry.registry.errors import RegistryError, suggest
from liger_registry.registry.family_switches import lacks, switch_on_problem
from liger_registry.registry.loader import Registry, load_registry
from liger_registry.schemas import LIGER_KEYS, OVERRIDE_PATHS, Overrides

# Knobs a liger_kernel_config-style dict may carry besides the kernel switches: the FLCE budget and strategy
# (docs/design/flce-layouts.md) and the FLCE loss options (docs/integrations.md).
LIGER_KNOBS = (
    "chunk_mem_const",
    "max_chunk_mib",
    "flce_strategy",
    "lse_square_scale",
    "label_smoothing",
    "accum_dtype",
    "use_token_scaling",
)

__all__ = ["LIGER_KEYS", "LIGER_KNOBS", "overrides_from_liger_kernel_config"]


def _section(entry: Any, key: str) -> Any:
    """The section holding the key's `enabled` knob (`kernels.<kind>`, `flce` or `cross_entropy`)."""
    section: Any = entry
    for part in OVERRIDE_PATHS[key].split(".")[:-1]:
        section = getattr(section, part)
    return section


def _as_kinds(config: dict[str, bool], model_type: str, entry: Any) -> dict[str, bool]:
    """Each key as the kinds the reference's switch patches on the type (registry.reference_switches: rms_norm also the fused
    add + norm, qwen3_moe's swiglu the experts), those the family has; a key mapping to none stays itself, for
    the rules below (off: a no-op, on: ignored with a warning)."""
    from liger_registry.registry.reference_switches import kinds_for

    out: dict[str, bool] = {}
    for key, value in config.items():
        ours = [kind for kind in kinds_for(model_type, key) if lacks(entry, kind) is None]
        out.update(dict.fromkeys(ours or [key], value))
    return out


def _knob_problems(knobs: dict[str, Any]) -> list[str]:
    try:
        Overrides.model_validate(knobs)
    except ValidationError as exc:
        return [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    return []


def overrides_from_liger_kernel_config(
    config: Mapping[str, Any] | None, model_type: str | None = None, registry: Registry | None = None
) -> dict[str, Any]:
    """Keyword overrides for `liger_registry.apply(...)` from a `liger_kernel_config` dict.

    Every key must be one of LIGER_KEYS with a bool value, or one of LIGER_KNOBS (the FLCE budget and
    strategy: chunk_mem_const, max_chunk_mib, flce_strategy; the FLCE loss options: lse_square_scale,
    label_smoothing, accum_dtype, use_token_scaling) with a value `apply` accepts, else RegistryError
    listing all problems. The switches follow `apply`'s rule: `False` turns a kernel off (for one the family
    lacks, a no-op the apply report lists); `True` on one the family cannot have is ignored with a warning naming
    what it has (one TrainingArguments config serves every model; `apply(model, layer_norm=True)` is an error).
    `True` means "use it where the family supports it" (liger's default): it changes nothing for a kernel that
    is on, switches on an opt-in one that is off by default (cross_entropy), and keeps a kernel the family entry
    turns off off, with a warning saying why. Each key means what the reference's switch patches on the model type
    (the table of `liger_registry.registry.reference_switches`: `rms_norm` also the fused add + norm, the MoE types' `swiglu` also
    `moe_experts`). Knobs pass through as overrides. Pass `model_type` to have the family checked; without it the
    values map one to one.
    """
    config = dict(config or {})
    allowed = (*LIGER_KEYS, *LIGER_KNOBS)
    problems = []
    for key, value in config.items():
        if key not in allowed:
            problems.append(f"unknown key {key!r}{suggest(str(key), allowed)}; allowed: {', '.join(allowed)}")
        elif key in LIGER_KEYS and not isinstance(value, bool):
            problems.append(f"{key}: expected true or false, got {value!r}")
    knobs = {k: v for k, v in config.items() if k in LIGER_KNOBS}
    problems += _knob_problems(knobs)
    if problems:
        raise RegistryError("invalid liger_kernel_config", problems)
    config = {k: v for k, v in config.items() if k in LIGER_KEYS}
    if model_type is None:
        return {**{k: v for k, v in config.items() if v is False}, **knobs}
    entry = (registry or load_registry()).family_for(model_type).entry
    config = _as_kinds(config, model_type, entry)
    if dropped := [k for k, v in config.items() if v and lacks(entry, k)]:
        # One TrainingArguments config serves every model it trains (liger-kernel drops such keys silently).
        warnings.warn(
            "liger_registry: liger_kernel_config keys ignored: "
            + "; ".join(switch_on_problem(entry, k) for k in dropped),
            UserWarning,
            stacklevel=2,
        )
        config = {k: v for k, v in config.items() if k not in dropped}
    overrides: dict[str, Any] = dict(knobs)
    for key, value in config.items():
        section = None if lacks(entry, key) else _section(entry, key)
        if value is False:
            overrides[key] = False
        elif section is None or section.enabled:
            continue
        elif "enabled" not in section.model_fields_set:  # off by default: an opt-in
            overrides[key] = True
        else:
            warnings.warn(
                f"liger_registry: liger_kernel_config {key}=True: family {entry.family!r} does not install it: "
                f"{section.reason or 'it is off in the family entry'}",
                stacklevel=2,
            )
    return overrides
