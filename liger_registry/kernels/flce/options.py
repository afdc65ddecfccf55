"""FlceOptions: the typed, validated, frozen options of one fused linear cross entropy call.

Its fields, defaults and checks are the table ``liger_registry.limits.FLCE_OPTIONS`` (declared once there for the
schemas, the policies, the keyword overrides and the custom op).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, make_dataclass
from typing import Any

import torch

from liger_registry.limits import FLCE_OPTIONS, LAYERED_OPTIONS, STRATEGIES, check_flce_options

__all__ = ["DEFAULT_OPTIONS", "OPTION_FIELDS", "STRATEGIES", "FlceOptions", "layered_options", "options_from"]


def _check(self) -> None:
    for name, value in check_flce_options({name: getattr(self, name) for name in FLCE_OPTIONS}).items():
        object.__setattr__(self, name, value)


FlceOptions = make_dataclass(
    "FlceOptions",
    [(o.name, o.annotation, field(default=o.default)) for o in FLCE_OPTIONS.values()],
    frozen=True,
    namespace={
        "__module__": __name__,
        "__post_init__": _check,
        "__doc__": """Options of :func:`fused_linear_cross_entropy`, validated once when built.

    ``chunk_mem_const`` (token chunks of ``flce_chunk_geometry``) and ``max_chunk_mib`` (MiB) are the two
    spellings of one budget, the size of the logits buffer; at most one may be set (neither: C=1).
    ``strategy`` picks how the loss is chunked (``auto``: the planner's choice, see ``flce_plan``).
    ``use_token_scaling`` multiplies each non-ignored token's loss (CE and z-loss terms) by ``p_y``, the softmax
    probability of its target under the transformed logits, detached (liger's ``use_token_scaling``); ``mean``
    still divides by the number (class weight sum) of non-ignored tokens.
    """,
    },
)

OPTION_FIELDS = frozenset(FLCE_OPTIONS)
DEFAULT_OPTIONS = FlceOptions()


def layered_options(values: Mapping[str, Any]) -> FlceOptions:
    """The options a resolved ``flce`` section sets (its YAML values; the model's config and the call add the
    rest): accum_dtype is named there (``float32``), a torch.dtype here."""
    kept = {o.name: values[o.name] for o in LAYERED_OPTIONS}
    if kept["accum_dtype"] is not None:
        kept["accum_dtype"] = getattr(torch, kept["accum_dtype"])
    return FlceOptions(**kept)


def options_from(options: FlceOptions | None, option_fields: dict) -> FlceOptions:
    """The options of a call given as one object, as keywords one by one, or neither (defaults)."""
    unknown = set(option_fields) - OPTION_FIELDS
    if unknown:
        raise TypeError(
            f"fused_linear_cross_entropy got unexpected keyword argument(s): {', '.join(sorted(unknown))}"
        )
    if options is None:
        return FlceOptions(**option_fields) if option_fields else DEFAULT_OPTIONS
    if not isinstance(options, FlceOptions):
        raise TypeError(f"options must be a FlceOptions, got {type(options).__name__}")
    if option_fields:
        names = ", ".join(sorted(option_fields))
        raise ValueError(
            f"{names} given both in options= and as keyword(s); use dataclasses.replace(options, {names.split(',')[0]}=...)"
        )
    return options
