"""The kernels API the rest of the package codes against (FlceOptions, options=, flce_plan, decide_backend), with
a stand-in for each piece the installed liger_registry.kernels does not have yet (before the kernels refactor
of issues 9/10 is merged). Nothing outside kernels/ calls the kernels' FLCE, plan or backend API but through here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from liger_registry import kernels

try:
    from liger_registry.kernels import FlceOptions

    HAS_FLCE_OPTIONS = True
except ImportError:  # pre-contract kernels: the same fields, validated by the keyword API at call time
    HAS_FLCE_OPTIONS = False

    @dataclasses.dataclass(frozen=True)
    class FlceOptions:  # type: ignore[no-redef]
        ignore_index: int = -100
        label_smoothing: float = 0.0
        softcap: float | None = None
        logit_scale: float = 1.0
        lse_square_scale: float = 0.0
        reduction: str = "mean"
        accum_dtype: torch.dtype | None = None
        chunk_mem_const: int | None = None
        max_chunk_mib: float | None = None
        strategy: str = "auto"

        def __post_init__(self) -> None:
            if self.chunk_mem_const is not None and self.max_chunk_mib is not None:
                raise ValueError("chunk_mem_const and max_chunk_mib are one budget: set at most one")


class KernelsContractMissing(RuntimeError):
    """The installed kernels lack a piece of the contract this feature needs (the kernels branch is not merged)."""


HAS_FLCE_PLAN = hasattr(kernels, "flce_plan")
HAS_DECIDE_BACKEND = hasattr(kernels, "decide_backend")


def _missing(what: str, issue: str) -> KernelsContractMissing:
    return KernelsContractMissing(
        f"{what} needs liger_registry.kernels from the kernels refactor ({issue}, CONTRACT.md), which this "
        "installation does not have yet"
    )


def options_problem(options: FlceOptions) -> str | None:
    """Why the installed kernels cannot run these options (only before the kernels refactor is merged)."""
    if HAS_FLCE_OPTIONS or (options.max_chunk_mib is None and options.strategy != "vocab"):
        return None
    return str(_missing("flce.max_chunk_mib / flce.strategy: vocab", "issue 10"))


def fused_linear_cross_entropy(hidden, weight, target, bias=None, *, options: FlceOptions, **flags: Any):
    """`kernels.fused_linear_cross_entropy(..., options=options, **flags)`."""
    if HAS_FLCE_OPTIONS:
        return kernels.fused_linear_cross_entropy(hidden, weight, target, bias, options=options, **flags)
    if problem := options_problem(options):
        raise KernelsContractMissing(problem)
    fields = dataclasses.asdict(options)
    del fields["max_chunk_mib"], fields["strategy"]
    fields["chunk_mem_const"] = fields["chunk_mem_const"] or 1  # 'tokens' and 'auto' are today's algorithm
    return kernels.fused_linear_cross_entropy(hidden, weight, target, bias, **fields, **flags)


def flce_plan(bt: int, h: int, v: int, **knobs: Any):
    """`kernels.flce_plan(bt, h, v, chunk_mem_const=, max_chunk_mib=, strategy=, dtype=)`."""
    if not HAS_FLCE_PLAN:
        raise _missing("explain --tokens (kernels.flce_plan)", "issue 10")
    return kernels.flce_plan(bt, h, v, **knobs)


def decide_backend(op: str, device: str | torch.device, dtype: torch.dtype) -> tuple[str, list[str]]:
    """`kernels.decide_backend(op, device, dtype)`: ("triton" | "torch", why not Triton)."""
    if HAS_DECIDE_BACKEND:
        return kernels.decide_backend(op, device, dtype)
    # pre-contract kernels: the op's Triton check on a one-element tensor of this device and dtype
    probe = torch.empty(1, device=device, dtype=dtype)
    reasons = kernels.why_not_triton(op, probe)
    return ("torch" if reasons else "triton"), reasons
