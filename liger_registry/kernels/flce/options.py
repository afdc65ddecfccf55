"""The options of one fused linear cross entropy call, and what the call runs flattened for its custom op.

* :class:`FlceOptions`: typed, validated, frozen; its fields, defaults and checks are the table
  ``liger_registry.limits.FLCE_OPTIONS`` (declared once there for the schemas, the policies, the keyword
  overrides and the custom op).
* :class:`FlceRun`: options, planned strategy and chunk, decided backend; ``flat()`` / ``from_flat`` are the
  custom op's positional arguments, :func:`takes_flat_run` gives an implementation their typed signature.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any

import torch

from liger_registry.limits import FLCE_OPTIONS, LAYERED_OPTIONS, OP_OPTIONS, STRATEGIES, check_flce_options

__all__ = [
    "DEFAULT_OPTIONS",
    "LOSS_FIELDS",
    "OPTION_FIELDS",
    "STRATEGIES",
    "FlceOptions",
    "FlceRun",
    "layered_options",
    "options_from",
    "takes_flat_run",
]


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


# the fields of FlceOptions the computation reads (the budget knobs and the strategy live on in the plan)
LOSS_FIELDS = OP_OPTIONS
_PLAN_FIELDS = (("strategy", str), ("chunk", int), ("backend", str), ("argmax_mode", int))


@dataclass(frozen=True)
class FlceRun:
    """One call's computation: ``strategy`` is ``"tokens"`` (``chunk`` rows per chunk) or ``"vocab"``
    (``chunk`` vocabulary columns per chunk); ``argmax_mode`` 0: none, 1: valid rows, 2: every row."""

    options: FlceOptions
    strategy: str
    chunk: int
    backend: str
    argmax_mode: int = 0

    def flat(self) -> tuple:
        """The positional arguments of the custom op (its schema has no dataclasses)."""
        o = self.options
        return (
            *(getattr(o, f) for f in LOSS_FIELDS),
            self.strategy,
            self.chunk,
            self.backend,
            self.argmax_mode,
        )

    @classmethod
    def from_flat(cls, *flat) -> FlceRun:
        """The run whose :meth:`flat` is ``flat``."""
        n = len(LOSS_FIELDS)
        options = FlceOptions(**dict(zip(LOSS_FIELDS, flat[:n], strict=True)))
        return cls(options, *flat[n:])


def _run_parameters() -> list[inspect.Parameter]:
    hints = typing.get_type_hints(FlceOptions)
    named = [(name, hints[name]) for name in LOSS_FIELDS] + list(_PLAN_FIELDS)
    return [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in named]


def takes_flat_run(fn: Callable) -> Callable:
    """``fn(leading..., *flat_run)`` with the signature torch.library reads for its schema: its leading parameters,
    then one typed parameter per field of :meth:`FlceRun.flat`."""
    signature = inspect.signature(fn, eval_str=True)
    leading = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    fn.__signature__ = signature.replace(parameters=leading + _run_parameters())
    return fn
