"""FLCE planner: the token-chunk geometry and the plan (strategy, chunk, buffer) of a call within its budget."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from liger_registry.limits import budget_knob, check_chunk_mem_const, check_max_chunk_mib, check_strategy

from . import cost
from .cost import DevicePeaks, device_peaks, known_peaks, peaks_of, tokens_ms, vocab_ms
from .vocab_geometry import vocab_geometry

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
    ``buffer_mib`` is the logits buffer, ``budget_mib`` its bound; ``why`` says why this strategy;
    ``predicted_ms`` the cost model's figure of the chosen strategy on ``device`` (see ``cost``).
    Vocab with a weight gradient (``scratch``): ``pass1_chunks`` chunks in pass 1 and ``num_chunks`` in pass 2,
    the ``widest`` of them in the weight gradient's not yet written memory (:mod:`vocab_geometry`), the
    rest in the buffer of ``chunk_vocab`` columns; pass 2 computes the logits of ``recomputed`` columns again (0:
    every chunk kept from pass 1)."""

    strategy: str
    chunk_tokens: int
    chunk_vocab: int
    num_chunks: int
    buffer_mib: float
    budget_mib: float
    why: str
    predicted_ms: float = 0.0
    device: str = "default"
    scratch: bool = False
    pass1_chunks: int = 0
    widest: int = 0
    recomputed: int = 0

    @property
    def chunk(self) -> int:
        """The chunk length along the strategy's axis (rows for tokens, columns for vocab)."""
        return self.chunk_tokens if self.strategy == "tokens" else self.chunk_vocab

    def __str__(self) -> str:
        if self.scratch:
            return (
                f"vocab: {self.pass1_chunks} + {self.num_chunks} chunks (pass 1 + pass 2), up to {self.widest} "
                f"columns in dW's memory, {self.recomputed} recomputed, buffer {self.buffer_mib:.1f} of "
                f"{self.budget_mib:.1f} MiB, "
                f"~{self.predicted_ms:.1f} ms on {self.device} ({self.why})"
            )
        return (
            f"{self.strategy}: {self.num_chunks} x [{self.chunk_tokens}, {self.chunk_vocab}] logits chunks, buffer "
            f"{self.buffer_mib:.1f} of {self.budget_mib:.1f} MiB, ~{self.predicted_ms:.1f} ms on {self.device} "
            f"({self.why})"
        )


def _tokens_chunk(
    bt: int, h: int, v: int, itemsize: int, chunk_mem_const: int | None, budget: float
) -> int | None:
    """Today's geometry under a chunk_mem_const budget; under a MiB budget the largest multiple of
    :data:`ROW_MULTIPLE` rows whose logits fit (fewer than that: the largest power of two), capped at BT. None
    when not even one row fits."""
    if chunk_mem_const is not None:
        return flce_chunk_geometry(bt, h, v, chunk_mem_const)[0]
    rows = int(budget // (v * itemsize))
    if rows < 1:
        return None
    return min(rows // ROW_MULTIPLE * ROW_MULTIPLE if rows >= ROW_MULTIPLE else _prev_pow2(rows), bt)


# row multiple of a token chunk under a MiB budget (a GEMM tile: GPT-OSS 512 MiB -> 1280 rows, not 1024)
ROW_MULTIPLE = 128


def _vocab_chunk(bt: int, v: int, itemsize: int, budget: float, align: int) -> int | None:
    """Columns per vocabulary chunk: V split into ``k = ceil(V / widest)`` even chunks, ``widest`` the most
    columns (a multiple of :data:`COL_MULTIPLE`) whose [BT, cols] logits fit, the width ``ceil(V / k)`` rounded
    up to that multiple (still within ``widest``); all V when they fit; None when not even ``align`` columns do."""
    fit = int(budget // (max(bt, 1) * itemsize))
    if fit >= v:
        return v
    step = min(COL_MULTIPLE, align)
    widest = fit // step * step
    if widest < align:
        return None
    k = math.ceil(v / widest)
    return math.ceil(math.ceil(v / k) / step) * step


# fewest columns of a vocabulary chunk (narrower ones waste the GEMMs); tests lower it so that tiny vocabularies
# are chunked
VOCAB_ALIGN = 128
# chunk widths are a multiple of this, or of VOCAB_ALIGN if smaller: widths only a multiple of 8 ran slower on the
# H200 (NOTES.md, "FLCE cost model: calibration")
COL_MULTIPLE = 128


def _budget_bytes(bt, h, v, chunk_mem_const, max_chunk_mib, itemsize) -> tuple[float, int | None]:
    if max_chunk_mib is not None:
        return max_chunk_mib * MIB, None
    c = 1 if chunk_mem_const is None else chunk_mem_const
    return flce_chunk_geometry(bt, h, v, c)[0] * v * itemsize, c


def _uncached(cached):
    """The function under an ``lru_cache`` while dynamo traces: it traces through a cache wrapper anyway, with a
    warning at every compile of a patched model; the planner's functions are pure in their int arguments."""
    return cached.__wrapped__ if torch.compiler.is_compiling() else cached


@lru_cache(maxsize=256)
def _plan(
    bt,
    h,
    v,
    chunk_mem_const,
    max_chunk_mib,
    strategy,
    itemsize,
    peaks: DevicePeaks,
    align: int,
    weight_grad: bool = True,
) -> FlcePlan:
    budget, cmc = _budget_bytes(bt, h, v, chunk_mem_const, max_chunk_mib, itemsize)
    rows = _tokens_chunk(bt, h, v, itemsize, cmc, budget)
    cols = _vocab_chunk(bt, v, itemsize, budget, align) if bt else None
    t_ms = tokens_ms(bt, h, v, rows, itemsize, peaks) if rows is not None else None
    multiple = min(COL_MULTIPLE, align)
    keeps = _uncached(cost.keeps_every_chunk)
    keep = cols is not None and weight_grad and keeps(bt, h, v, cols, itemsize, peaks, multiple)
    v_ms = (
        vocab_ms(bt, h, v, cols, itemsize, peaks, weight_grad, multiple, keep) if cols is not None else None
    )
    vocab = (h, multiple, weight_grad, keep)
    vocab_no = f"{align} vocabulary columns of {bt} rows exceed the budget" if cols is None else ""
    if rows is None and cols is None:
        raise ValueError(
            f"max_chunk_mib={budget / MIB:g} is smaller than one row of logits ({v * itemsize / MIB:.3f} MiB) "
            f"and than {align} columns of all {bt} rows"
        )
    if strategy == "tokens" or cols is None:
        if rows is None:
            raise ValueError(
                f"strategy=tokens: max_chunk_mib={budget / MIB:g} is smaller than one row of logits"
            )
        why = "strategy=tokens" if strategy == "tokens" else f"vocab infeasible: {vocab_no}"
        return _make("tokens", bt, v, rows, budget, itemsize, why, t_ms, peaks, vocab)
    if strategy == "vocab" or rows is None:
        why = (
            "strategy=vocab"
            if strategy == "vocab"
            else "tokens infeasible: one row of logits exceeds the budget"
        )
        return _make("vocab", bt, v, cols, budget, itemsize, why, v_ms, peaks, vocab)
    if v_ms < t_ms:
        return _make(
            "vocab",
            bt,
            v,
            cols,
            budget,
            itemsize,
            f"predicted vocab {v_ms:.1f} < tokens {t_ms:.1f} ms",
            v_ms,
            peaks,
            vocab,
        )
    return _make(
        "tokens",
        bt,
        v,
        rows,
        budget,
        itemsize,
        f"predicted tokens {t_ms:.1f} <= vocab {v_ms:.1f} ms",
        t_ms,
        peaks,
        vocab,
    )


def _make(strategy, bt, v, chunk, budget, itemsize, why, ms, peaks, vocab) -> FlcePlan:
    if strategy == "tokens":
        n = math.ceil(bt / chunk) if chunk else 0
        return FlcePlan("tokens", chunk, v, n, chunk * v * itemsize / MIB, budget / MIB, why, ms, peaks.name)
    h, multiple, weight_grad, keep = vocab
    g = vocab_geometry(bt, h, v, chunk, weight_grad, multiple, keep)
    widest = max(c.width for c in g.pass1) if g.pass1 else 0
    buffer = bt * g.buffer_cols * itemsize / MIB
    return FlcePlan(
        "vocab",
        bt,
        chunk,
        len(g.pass2),
        buffer,
        budget / MIB,
        why,
        ms,
        peaks.name,
        g.scratch,
        len(g.pass1),
        widest,
        g.recomputed,
    )


def flce_plan(
    bt: int,
    h: int,
    v: int,
    *,
    chunk_mem_const: int | None = None,
    max_chunk_mib: float | None = None,
    strategy: str = "auto",
    dtype: torch.dtype = torch.bfloat16,
    gpu: str | None = None,
    weight_grad: bool = True,
) -> FlcePlan:
    """The plan of an FLCE call on ``bt`` tokens, hidden ``h``, vocabulary ``v`` (logits in ``dtype``).

    Budget of the logits buffer: ``max_chunk_mib`` MiB, else the C=``chunk_mem_const`` (default 1) token chunk's
    buffer ``chunk_tokens(C) * V * itemsize`` of :func:`flce_chunk_geometry`; no strategy exceeds it.
    ``tokens`` with a chunk_mem_const budget is today's geometry exactly; with a MiB budget the largest multiple
    of 128 rows that fits. ``vocab``: all rows, V in the fewest even chunks (widths a multiple of 8, at least 128
    columns) that fit (infeasible -> tokens, said in ``why``). ``auto`` takes the cheaper by :mod:`cost` on ``gpu`` (a CUDA device name;
    default: the current CUDA device, or the table's default row without CUDA). ``weight_grad``: the weight
    gradient is computed (its memory holds the vocab strategy's widest chunks until written; False: a frozen
    head, budget-buffer chunks only).
    """
    _check_shape(bt, h, v)
    if budget_knob(chunk_mem_const, max_chunk_mib) == "chunk_mem_const":
        check_chunk_mem_const(chunk_mem_const)
    mib = None if max_chunk_mib is None else check_max_chunk_mib(max_chunk_mib)
    check_strategy(strategy)
    peaks = device_peaks() if gpu is None else known_peaks(gpu)
    return _plan(
        bt, h, v, chunk_mem_const, mib, strategy, dtype.itemsize, peaks, VOCAB_ALIGN, bool(weight_grad)
    )


def plan_for(
    bt: int, h: int, v: int, options, dtype: torch.dtype, device: torch.device, weight_grad: bool = True
) -> FlcePlan:
    """The plan of a call whose :class:`FlceOptions` are already validated (no second validation, cached)."""
    peaks = peaks_of(device)
    plan = _uncached(_plan)
    knobs = (options.chunk_mem_const, options.max_chunk_mib, options.strategy)
    return plan(bt, h, v, *knobs, dtype.itemsize, peaks, VOCAB_ALIGN, weight_grad)
