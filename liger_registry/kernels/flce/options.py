"""FlceOptions: the typed, validated, frozen options of one fused linear cross entropy call."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from liger_registry.constants import IGNORE_INDEX
from liger_registry.limits import MAX_CHUNK_MEM_CONST, MAX_CHUNK_MIB, check_ignore_index, check_logit_factor

from ..ce.torch_rows import check_ce_options

STRATEGIES = ("auto", "tokens", "vocab")


def check_chunk_mem_const(chunk_mem_const: object, name: str = "chunk_mem_const") -> int:
    """The one check of the token-chunk constant: an int in [1, MAX_CHUNK_MEM_CONST] (bool is refused)."""
    if (
        isinstance(chunk_mem_const, bool)
        or not isinstance(chunk_mem_const, int)
        or not 1 <= chunk_mem_const <= MAX_CHUNK_MEM_CONST
    ):
        raise ValueError(f"{name} must be an int in [1, {MAX_CHUNK_MEM_CONST}], got {chunk_mem_const!r}")
    return chunk_mem_const


def check_max_chunk_mib(max_chunk_mib: object) -> float:
    if isinstance(max_chunk_mib, bool) or not isinstance(max_chunk_mib, (int, float)):
        raise ValueError(f"max_chunk_mib must be a positive number of MiB, got {max_chunk_mib!r}")
    if not (math.isfinite(max_chunk_mib) and 0 < max_chunk_mib <= MAX_CHUNK_MIB):
        raise ValueError(
            f"max_chunk_mib must be a number of MiB in (0, {MAX_CHUNK_MIB:g}], got {max_chunk_mib!r}"
        )
    return float(max_chunk_mib)


def check_strategy(strategy: object) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; expected one of {', '.join(STRATEGIES)}")
    return strategy


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FlceOptions:
    """Options of :func:`fused_linear_cross_entropy`, validated once when built.

    ``chunk_mem_const`` (token chunks of ``flce_chunk_geometry``) and ``max_chunk_mib`` (MiB) are the two
    spellings of one budget, the size of the logits buffer; at most one may be set (neither: C=1).
    ``strategy`` picks how the loss is chunked (``auto``: the planner's choice, see ``flce_plan``).
    ``use_token_scaling`` multiplies each non-ignored token's loss (CE and z-loss terms) by ``p_y``, the softmax
    probability of its target under the transformed logits, detached (liger's ``use_token_scaling``); ``mean``
    still divides by the number (class weight sum) of non-ignored tokens.
    """

    ignore_index: int = IGNORE_INDEX
    label_smoothing: float = 0.0
    softcap: float | None = None
    logit_scale: float = 1.0
    lse_square_scale: float = 0.0
    reduction: str = "mean"  # mean | sum | none
    accum_dtype: torch.dtype | None = None
    chunk_mem_const: int | None = None  # None: 1 unless max_chunk_mib is set
    max_chunk_mib: float | None = (
        None  # memory budget of the logits buffer, MiB; exclusive with chunk_mem_const
    )
    strategy: str = "auto"  # auto | tokens | vocab
    use_token_scaling: bool = False  # each token's loss times its detached probability of the target

    def __post_init__(self) -> None:
        check_ignore_index(self.ignore_index)
        set_ = object.__setattr__
        set_(self, "label_smoothing", _number("label_smoothing", self.label_smoothing))
        set_(self, "logit_scale", _number("logit_scale", self.logit_scale))
        set_(self, "lse_square_scale", _number("lse_square_scale", self.lse_square_scale))
        if self.softcap is not None:
            set_(self, "softcap", check_logit_factor("softcap", _number("softcap", self.softcap)))
        check_ce_options(self.label_smoothing, self.softcap, self.reduction)
        check_logit_factor("logit_scale", self.logit_scale)
        if self.accum_dtype is not None and not (
            isinstance(self.accum_dtype, torch.dtype) and self.accum_dtype.is_floating_point
        ):
            raise ValueError(f"accum_dtype must be a floating torch.dtype or None, got {self.accum_dtype!r}")
        if self.chunk_mem_const is not None and self.max_chunk_mib is not None:
            raise ValueError(
                "chunk_mem_const and max_chunk_mib are one budget knob; set one of them, not both "
                f"(got chunk_mem_const={self.chunk_mem_const!r}, max_chunk_mib={self.max_chunk_mib!r})"
            )
        if self.chunk_mem_const is not None:
            check_chunk_mem_const(self.chunk_mem_const)
        if self.max_chunk_mib is not None:
            set_(self, "max_chunk_mib", check_max_chunk_mib(self.max_chunk_mib))
        check_strategy(self.strategy)
        if not isinstance(self.use_token_scaling, bool):
            raise ValueError(f"use_token_scaling must be True or False, got {self.use_token_scaling!r}")


OPTION_FIELDS = frozenset(f.name for f in fields(FlceOptions))
DEFAULT_OPTIONS = FlceOptions()


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
