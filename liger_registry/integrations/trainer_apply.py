"""How the Trainer integrations apply a `liger_kernel_config`: to an unpatched model, or to a patched one only
when the patch agrees with every knob the config (or the integration's own options) names."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from liger_registry.integrations.liger_config import overrides_from_liger_kernel_config
from liger_registry.registry.applier import PatchHandle, apply, patch_handle
from liger_registry.registry.configure import configure, model_type_of, unwrap_model
from liger_registry.registry.errors import PatchError, UnsupportedModelError
from liger_registry.registry.resolve import Layer, ResolvedConfig
from liger_registry.registry.trl_head import trl_fused_head
from liger_registry.schemas import LIGER_KEYS, OVERRIDE_PATHS

logger = logging.getLogger(__name__)

ASKED_LAYERS = (Layer.USER_POLICY, Layer.OVERRIDE)  # what the caller names
FLCE_ENABLED = OVERRIDE_PATHS["fused_linear_cross_entropy"]


def _named(wanted: ResolvedConfig, config: Mapping[str, Any], model_type: str) -> list[str]:
    """The knobs the caller names: set by its policy or overrides, and the kernels its config switches on
    (`True` asks for the family's kernels that the reference's switch patches, which the overrides do not carry)."""
    from liger_registry.registry.reference_switches import kinds_for

    named = [knob for knob, source in wanted.provenance.items() if source.layer in ASKED_LAYERS]
    switched_on = [
        OVERRIDE_PATHS[kind]
        for k, v in config.items()
        if k in LIGER_KEYS and v is True
        for kind in kinds_for(model_type, k)
    ]
    return [*named, *(k for k in dict.fromkeys(switched_on) if k in wanted.values and k not in named)]


def _differences(model: Any, existing: PatchHandle, wanted: ResolvedConfig, config: Mapping) -> list[str]:
    have = existing.report.config.values
    knobs = _named(wanted, config, model_type_of(model))
    if trl_fused_head(model) is not None:
        # TRL asks fused_linear_cross_entropy=False to keep its fused LM head on top; it is on top (it wraps the
        # patch), so it computes the training loss either way
        knobs = [k for k in knobs if k != FLCE_ENABLED]
    return [
        f"{knob}: patched {have.get(knob)!r}, asked {wanted.values[knob]!r}"
        for knob in knobs
        if have.get(knob) != wanted.values[knob]
    ]


def apply_liger_kernel_config(
    model: Any,
    config: Mapping[str, Any] | None,
    *,
    policy: str | Path | list | None,
    strict: bool,
    overrides: Mapping[str, Any],
    source: str,
) -> tuple[PatchHandle | None, bool]:
    """(handle, whether this call installed it) after applying `config` (translated) with `policy`, `overrides`
    and `strict` to the transformers model inside `model`'s wrappers.

    A model already patched keeps its patch when the patch agrees with every knob asked; a knob asked otherwise
    is a PatchError naming each difference (`source` says who asked), and nothing is changed: the same rule as
    `apply`, except that the knobs nobody names keep the values the model was patched with. An unsupported model
    type with `strict=False` is a warning and no handle (the model trains unpatched).
    """
    inner = unwrap_model(model)
    config = dict(config or {})
    existing = patch_handle(inner)
    try:
        from_config = overrides_from_liger_kernel_config(config, model_type_of(inner))
    except UnsupportedModelError:
        if strict or existing is not None:
            raise
        from_config = overrides_from_liger_kernel_config(config)  # its keys checked; apply() warns
    wanted = {**from_config, **overrides}
    if existing is None:
        handle = apply(inner, policy=policy, strict=strict, **wanted)
        if handle is not None:
            asked = ", ".join(f"{k}={v!r}" for k, v in wanted.items())
            logger.info(
                "%s: patched family %s (%s)%s",
                source,
                handle.report.family,
                type(inner).__name__,
                f" with {asked}" if asked else "",
            )
        return handle, handle is not None
    if differences := _differences(inner, existing, configure(inner, policy, **wanted), config):
        raise PatchError(
            f"liger_registry: {source}: the model is already patched (family {existing.report.family!r}) with "
            "other values than asked; nothing was changed:\n"
            + "\n".join(f"  - {d}" for d in differences)
            + "\nRevert the patch first (liger_registry.revert(model)) to apply this configuration, "
            "or leave these keys out of it."
        )
    logger.info("%s: %s keeps its patch (family %s)", source, type(inner).__name__, existing.report.family)
    return existing, False
