"""The FLCE options and the numeric knobs' ranges, declared once for the YAML schemas, the policies, the keyword
overrides, the kernels' typed options and the FLCE custom op.

Torch-free (the schemas import it without torch). An absurd value (``10**30``) is refused where it is written,
with the range, instead of overflowing inside a kernel or a custom op's int64 argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt

from liger_registry.constants import IGNORE_INDEX

# C beyond the vocabulary size changes nothing (one token chunk per call); 2**20 covers every vocabulary.
MAX_CHUNK_MEM_CONST = 2**20
# 1 PiB of logits buffer: more than any device holds, far below float overflow.
MAX_CHUNK_MIB = float(2**30)
# labels are int64 (or int32) tensors; the ignore value must be one of them.
IGNORE_INDEX_MIN, IGNORE_INDEX_MAX = -(2**63), 2**63 - 1
# softcap and logit_scale multiply fp32 logits; beyond this they overflow to inf and the loss to NaN.
MAX_LOGIT_FACTOR = 1e30
STRATEGIES = ("auto", "tokens", "vocab")
REDUCTIONS = ("mean", "sum", "none")
BUDGET_KNOBS = ("chunk_mem_const", "max_chunk_mib")


def check_ignore_index(ignore_index: object) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"ignore_index must be an int, got {ignore_index!r}")
    if not IGNORE_INDEX_MIN <= ignore_index <= IGNORE_INDEX_MAX:
        raise ValueError(f"ignore_index must be in the int64 range [-2**63, 2**63 - 1], got {ignore_index}")
    return ignore_index


def check_logit_factor(name: str, value: float) -> float:
    if not 0.0 < value <= MAX_LOGIT_FACTOR:
        raise ValueError(f"{name} must be in (0, {MAX_LOGIT_FACTOR:g}], got {value!r}")
    return value


def check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_chunk_mem_const(chunk_mem_const: object, name: str = "chunk_mem_const") -> int:
    """The one check of a token-chunk constant: an int in [1, MAX_CHUNK_MEM_CONST] (bool is refused)."""
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


def check_reduction(reduction: object) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; expected one of {', '.join(REDUCTIONS)}")
    return reduction


def check_label_smoothing(value: object) -> float:
    value = check_number("label_smoothing", value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def budget_knob(chunk_mem_const: object, max_chunk_mib: object) -> str | None:
    """The one-budget-knob rule: chunk_mem_const (token chunks) and max_chunk_mib (MiB) are two spellings of the
    logits buffer's size; the one set (None: neither, C=1); both is an error."""
    if chunk_mem_const is not None and max_chunk_mib is not None:
        raise ValueError(
            "chunk_mem_const and max_chunk_mib are one budget knob: set one of them (max_chunk_mib in MiB, or "
            f"chunk_mem_const), not both (got chunk_mem_const={chunk_mem_const!r}, max_chunk_mib={max_chunk_mib!r})"
        )
    if max_chunk_mib is not None:
        return "max_chunk_mib"
    return "chunk_mem_const" if chunk_mem_const is not None else None


# pydantic types of the values a YAML file, a policy or an apply() keyword may write
ChunkConst = Annotated[StrictInt, Field(ge=1, le=MAX_CHUNK_MEM_CONST)]
Mib = (
    Annotated[StrictInt, Field(gt=0, le=int(MAX_CHUNK_MIB))]
    | Annotated[StrictFloat, Field(gt=0, le=MAX_CHUNK_MIB, allow_inf_nan=False)]
)
FlceStrategy = Literal["auto", "tokens", "vocab"]
AccumDtype = Literal["float32"]
ZLossScale = Annotated[StrictFloat, Field(ge=0, allow_inf_nan=False)] | Annotated[StrictInt, Field(ge=0)]
Smoothing = Annotated[StrictFloat, Field(ge=0, le=1)] | Annotated[StrictInt, Field(ge=0, le=1)]


@dataclass(frozen=True)
class FlceOption:
    """One option of fused linear cross entropy, as every layer that may set it sees it.

    A call takes every option (``FlceOptions``); ``schema`` set: a family's ``flce`` section (its default in
    registry/defaults.yaml), a policy's ``flce`` patch and the ``apply()`` keyword ``keyword`` set it too, with
    ``schema`` their type (``nullable``: null is a value, "unset"); ``op``: the computation reads it, so it is an
    argument of the ``flce_forward`` custom op (the others live on in the plan).
    """

    name: str
    annotation: str  # the type of FlceOptions' field and of the custom op's argument
    default: Any  # of a call
    check: Callable[[Any], Any]  # a call's value -> the value kept; ValueError saying the range
    description: str = ""
    schema: Any = None
    nullable: bool = False
    keyword: str | None = None
    op: bool = True

    @property
    def layered(self) -> bool:
        """Whether the registry's layers (family, policies, apply() keywords) set it."""
        return self.schema is not None


def _softcap(value: object) -> float | None:
    return None if value is None else check_logit_factor("softcap", check_number("softcap", value))


def _chunk_mem_const(value: object) -> int | None:
    return None if value is None else check_chunk_mem_const(value)


def _max_chunk_mib(value: object) -> float | None:
    return None if value is None else check_max_chunk_mib(value)


def _accum_dtype(value: object) -> object:
    # a floating torch.dtype (its is_floating_point is a bool property, a tensor's is a method), torch-free
    if value is not None and getattr(value, "is_floating_point", None) is not True:
        raise ValueError(f"accum_dtype must be a floating torch.dtype or None, got {value!r}")
    return value


FLCE_OPTIONS: dict[str, FlceOption] = {
    o.name: o
    for o in (
        FlceOption("ignore_index", "int", IGNORE_INDEX, check_ignore_index),
        FlceOption(
            "label_smoothing",
            "float",
            0.0,
            check_label_smoothing,
            "FLCE label smoothing, in [0, 1] (as F.cross_entropy).",
            schema=Smoothing,
        ),
        FlceOption("softcap", "float | None", None, _softcap),
        FlceOption(
            "logit_scale",
            "float",
            1.0,
            lambda v: check_logit_factor("logit_scale", check_number("logit_scale", v)),
        ),
        FlceOption(
            "lse_square_scale",
            "float",
            0.0,
            lambda v: check_number("lse_square_scale", v),
            "FLCE z-loss: adds lse_square_scale * logsumexp(logits)**2 per non-ignored token (>= 0; 0: off).",
            schema=ZLossScale,
        ),
        FlceOption("reduction", "str", "mean", check_reduction),
        FlceOption(
            "accum_dtype",
            "torch.dtype | None",
            None,
            _accum_dtype,
            "float32: accumulate the head's weight gradient in fp32 (16-bit models); null: in its dtype.",
            schema=AccumDtype,
            nullable=True,
        ),
        FlceOption(
            "chunk_mem_const",
            "int | None",
            None,
            _chunk_mem_const,
            "FLCE chunk constant C in inc = ceil(V / (C*H)): larger C means fewer, bigger token chunks. One "
            "budget knob with max_chunk_mib: setting one clears the other from lower layers.",
            schema=ChunkConst,
            nullable=True,
            op=False,
        ),
        FlceOption(
            "max_chunk_mib",
            "float | None",
            None,
            _max_chunk_mib,
            "FLCE memory budget of the logits buffer in MiB, instead of chunk_mem_const (one budget knob: "
            "setting one clears the other from lower layers; both in one place is an error).",
            schema=Mib,
            nullable=True,
            op=False,
        ),
        FlceOption(
            "strategy",
            "str",
            "auto",
            check_strategy,
            "FLCE chunking: auto: the planner picks per call; tokens: chunk over tokens (the C=1 algorithm); "
            "vocab: chunk over the vocabulary.",
            schema=FlceStrategy,
            keyword="flce_strategy",
            op=False,
        ),
        FlceOption(
            "use_token_scaling",
            "bool",
            False,
            lambda v: check_bool("use_token_scaling", v),
            "Multiply each token's loss by its predicted probability of the target (detached), as liger's "
            "use_token_scaling.",
            schema=StrictBool,
        ),
    )
}
LAYERED_OPTIONS = tuple(o for o in FLCE_OPTIONS.values() if o.layered)
OP_OPTIONS = tuple(name for name, o in FLCE_OPTIONS.items() if o.op)


def check_flce_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """A call's options checked, in the table's order, and normalised; the budget rule last."""
    checked = {name: FLCE_OPTIONS[name].check(value) for name, value in values.items()}
    budget_knob(checked.get("chunk_mem_const"), checked.get("max_chunk_mib"))
    return checked
