"""FLCE planner: the token-chunk geometry and the plan (strategy, chunk, buffer) of a call within its budget."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from .flce_options import check_chunk_mem_const, check_max_chunk_mib, check_strategy

MIB = 1 << 20


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _prev_pow2(x: int) -> int:
    return 1 << (x.bit_length() - 1) if x >= 1 else 0


def flce_chunk_geometry(bt: int, h: int, v: int, chunk_mem_const: int = 1) -> tuple[int, int]:
    """``(chunk_size, num_chunks)`` for ``bt`` tokens: ``inc = ceil(V / (C*H))``,
    ``chunk = min(next_pow2(ceil(BT / inc)), BT)``, ``num_chunks = ceil(BT / chunk)``.

    At BT=8192, H=4096, V=128256: C=1 -> (256, 32), C=8 -> (2048, 4), C=16 -> (4096, 2).
    """
    c = check_chunk_mem_const(chunk_mem_const)
    _check_shape(bt, h, v)
    if bt == 0:
        return 0, 0
    inc = max(1, math.ceil(v / (c * max(h, 1))))
    chunk = min(_next_pow2(math.ceil(bt / inc)), bt)
    return chunk, math.ceil(bt / chunk)


def _check_shape(bt: object, h: object, v: object) -> None:
    for name, val in (("bt", bt), ("h", h), ("v", v)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise ValueError(f"{name} must be a non-negative int, got {val!r}")


@dataclass(frozen=True)
class FlcePlan:
    """How one FLCE call is chunked. ``tokens``: ``num_chunks`` chunks of ``chunk_tokens`` rows (all ``chunk_vocab``
    = V columns); ``vocab``: all ``chunk_tokens`` = BT rows, ``num_chunks`` chunks of ``chunk_vocab`` columns.
    ``buffer_mib`` is the logits buffer, ``budget_mib`` its bound; ``why`` says why this strategy."""

    strategy: str
    chunk_tokens: int
    chunk_vocab: int
    num_chunks: int
    buffer_mib: float
    budget_mib: float
    why: str

    @property
    def chunk(self) -> int:
        """The chunk length along the strategy's axis (rows for tokens, columns for vocab)."""
        return self.chunk_tokens if self.strategy == "tokens" else self.chunk_vocab

    def __str__(self) -> str:
        shape = f"{self.num_chunks} x [{self.chunk_tokens}, {self.chunk_vocab}]"
        return (
            f"{self.strategy}: {shape} logits chunks, buffer {self.buffer_mib:.1f} MiB of "
            f"{self.budget_mib:.1f} MiB budget ({self.why})"
        )


def _tokens_chunk(bt: int, h: int, v: int, itemsize: int, chunk_mem_const: int | None, budget: float) -> int:
    if chunk_mem_const is not None:
        return flce_chunk_geometry(bt, h, v, chunk_mem_const)[0]
    rows = int(budget // (v * itemsize))
    if rows < 1:
        raise ValueError(
            f"max_chunk_mib={budget / MIB:g} is smaller than one row of logits ({v * itemsize / MIB:.3f} MiB)"
        )
    return min(_prev_pow2(rows), bt)


def _tokens_plan(bt, h, v, itemsize, chunk_mem_const, budget, why) -> FlcePlan:
    chunk = _tokens_chunk(bt, h, v, itemsize, chunk_mem_const, budget)
    return FlcePlan(
        "tokens",
        chunk,
        v,
        math.ceil(bt / chunk) if chunk else 0,
        chunk * v * itemsize / MIB,
        budget / MIB,
        why,
    )


@lru_cache(maxsize=256)
def _plan(bt, h, v, chunk_mem_const, max_chunk_mib, strategy, itemsize) -> FlcePlan:
    if max_chunk_mib is None:
        c = 1 if chunk_mem_const is None else chunk_mem_const
        budget = flce_chunk_geometry(bt, h, v, c)[0] * v * itemsize
        cmc = c
    else:
        budget = max_chunk_mib * MIB
        cmc = None
    if strategy == "vocab":
        raise NotImplementedError("strategy 'vocab' is not implemented yet")
    why = "forced by strategy=tokens" if strategy == "tokens" else "the only strategy"
    return _tokens_plan(bt, h, v, itemsize, cmc, budget, why)


def flce_plan(
    bt: int,
    h: int,
    v: int,
    *,
    chunk_mem_const: int | None = None,
    max_chunk_mib: float | None = None,
    strategy: str = "auto",
    dtype: torch.dtype = torch.bfloat16,
) -> FlcePlan:
    """The plan of an FLCE call on ``bt`` tokens, hidden ``h``, vocabulary ``v`` (logits in ``dtype``).

    Budget of the logits buffer: ``max_chunk_mib`` MiB, else the C=``chunk_mem_const`` (default 1) token chunk's
    buffer ``chunk_tokens(C) * V * itemsize`` of :func:`flce_chunk_geometry`; no strategy exceeds it.
    """
    _check_shape(bt, h, v)
    if chunk_mem_const is not None and max_chunk_mib is not None:
        raise ValueError("chunk_mem_const and max_chunk_mib are one budget knob; set one of them, not both")
    if chunk_mem_const is not None:
        check_chunk_mem_const(chunk_mem_const)
    mib = None if max_chunk_mib is None else check_max_chunk_mib(max_chunk_mib)
    check_strategy(strategy)
    return _plan(bt, h, v, chunk_mem_const, mib, strategy, dtype.itemsize)


def plan_for(
    bt: int, h: int, v: int, options, dtype: torch.dtype, device: torch.device | None = None
) -> FlcePlan:
    """The plan of a call whose :class:`FlceOptions` are already validated (no second validation, cached)."""
    plan = _plan.__wrapped__ if torch.compiler.is_compiling() else _plan  # dynamo traces through the cache
    return plan(bt, h, v, options.chunk_mem_const, options.max_chunk_mib, options.strategy, dtype.itemsize)
