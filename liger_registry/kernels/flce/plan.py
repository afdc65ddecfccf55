"""The FLCE plan of a call: its chunk geometries, the cost model of both strategies, and the plan chosen within its budget.

* ``flce_chunk_geometry(bt, h, v, C)``: the token chunk (``inc = ceil(V / (C H))``, ``chunk = min(next_pow2(ceil(BT /
  inc)), BT)``).
* ``vocab_geometry(...)``: the vocabulary strategy's chunks per pass and where their logits live (the budget
  buffer or dW's not yet written storage); docs/design/flce-layouts.md.
* ``tokens_ms`` / ``vocab_ms``: predicted ms of each strategy from FLOPs and bytes (no benchmarking);
  docs/design/flce-cost-model.md has the calibration.
* ``flce_plan(...)`` / ``plan_for(...)``: the :class:`FlcePlan` (strategy, chunk, buffer, why) of a call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

import torch

from liger_registry.limits import (
    budget_knob,
    check_chunk_mem_const,
    check_max_chunk_mib,
    check_reduction,
    check_strategy,
)

# ---------------------------------------------------------------- vocabulary chunk geometry
# Chunk geometry of the FLCE vocabulary strategy: the columns of each pass and where their logits live.
#
# Why a scratch region: the weight gradient dW [V, H] is allocated before pass 1 and each of its rows is written
# once, in pass 2. Until a row is written its memory holds nothing, so the logits of a chunk may live there as
# long as they do not overlap the dW rows their own pass writes. That memory is the output's, not extra: peak
# memory stays that of the budget buffer, while the chunks grow from ~H columns (the C=1 budget) to a large
# share of V. Fewer, larger chunks mean fewer launches (the loop was host- and gap-bound at 2-4k tokens), one
# fp32 dX accumulator pass per chunk instead of ~V/H of them, and pass 1's last chunk, made as wide as the
# memory allows, kept for pass 2 without a second logits GEMM.
#
# With ``N`` rows, the logits of ``w`` columns take ``N w`` elements from the front of dW's storage; pass-2
# chunk ``[s, s + w)`` writes dW rows at ``[s H, (s + w) H)``, so it may use the scratch when ``N w <= s H``:
#
# * pass 1: the columns ``[0, V - r)`` in even chunks of at most ``V H / N`` columns, then the last chunk
#   ``[V - r, V)`` with ``r = V H / (N + H)`` (the widest that does not overlap its own dW rows);
# * pass 2 (descending): ``[V - r, V)`` reusing pass 1's logits, then from ``e = V - r`` down the chunks
#   ``[s, e)`` with ``s = N e / (N + H)`` (each ``(N + H) / N`` times narrower than the columns left) while they
#   are wider than the budget buffer, and the rest in budget-buffer chunks.
#
# With no more rows than the hidden size (``N <= H``: 2-4k tokens per micro-batch on a 4k-wide model) every
# chunk's logits can be kept from pass 1 to pass 2, so pass 2 runs no logits GEMM at all (:func:`kept_geometry`):
# the first chunk ``[0, w0)`` (``w0`` the budget buffer's width) stays in the buffer, and each later chunk
# ``[s, e)`` lies in dW's storage right after the logits of the columns before it, at ``N (s - w0)``, which ends
# below its own dW rows when ``N (e - w0) <= s H``: widths grow by ``H / N`` per chunk. Pass 2 (descending) writes
# each chunk's dW rows above the logits still to be read. At N = H the widths stop growing (~V / w0 chunks). The
# caller chooses it by the cost model (``keep``, :func:`keeps_every_chunk`; docs/design/flce-layouts.md has how
# it compared on the H200). It is built up to KEPT_MAX_CHUNKS chunks.
#
# Without a weight gradient (a frozen head) or when ``r`` is no wider than the budget buffer (many rows), the
# geometry is the plain one: even budget-buffer chunks, pass 2 reusing the last.


class VocabChunk(NamedTuple):
    """Columns ``[start, start + width)``; ``scratch``: logits in dW's storage from element ``offset`` on, else at
    the front of the budget buffer; ``reuse`` (pass 2 only): pass 1 left this chunk's logits there (no logits
    GEMM)."""

    start: int
    width: int
    scratch: bool = False
    reuse: bool = False
    offset: int = 0


class VocabGeometry(NamedTuple):
    """Pass 1 in ascending, pass 2 in descending column order; ``buffer_cols`` the budget buffer's width in use
    (0: every chunk in the scratch)."""

    pass1: tuple[VocabChunk, ...]
    pass2: tuple[VocabChunk, ...]

    @property
    def buffer_cols(self) -> int:
        # no max(..., default=): dynamo of torch 2.11 graph-breaks on it, and the planner runs under compile
        return max([0, *(c.width for c in (*self.pass1, *self.pass2) if not c.scratch)])

    @property
    def scratch(self) -> bool:
        return any(c.scratch for c in self.pass1)

    @property
    def recomputed(self) -> int:
        """Columns whose logits pass 2 computes again."""
        return sum(c.width for c in self.pass2 if not c.reuse)


def _even(start: int, stop: int, widest: int, multiple: int) -> list[tuple[int, int]]:
    """``[start, stop)`` in the fewest even chunks of at most ``widest`` columns (widths a multiple of
    ``multiple`` where that stays within ``widest``), ascending."""
    total = stop - start
    if total <= 0:
        return []
    k = math.ceil(total / widest)
    width = min(math.ceil(math.ceil(total / k) / multiple) * multiple, widest)
    return [(s, min(width, stop - s)) for s in range(start, stop, width)]


def plain_geometry(v: int, width: int) -> VocabGeometry:
    """Chunks of ``width`` columns (the planner's even split) in the budget buffer; pass 2 reuses pass 1's last."""
    chunks = [VocabChunk(s, min(width, v - s)) for s in range(0, v, max(width, 1))]
    pass2 = [c._replace(reuse=i == 0) for i, c in enumerate(reversed(chunks))]
    return VocabGeometry(tuple(chunks), tuple(pass2))


# the kept geometry is built up to this many chunks (beyond the counts docs/design/flce-layouts.md measured, launches
# and the fp32 dX accumulator's pass per chunk are untested against the logits GEMMs it saves)
KEPT_MAX_CHUNKS = 64


def kept_geometry(n: int, h: int, v: int, width: int, multiple: int = 128) -> VocabGeometry | None:
    """Every chunk's logits kept from pass 1 to pass 2 (``N <= H``, see the module doc); None when it does not
    apply or needs more than KEPT_MAX_CHUNKS chunks."""
    if n <= 0 or n > h or width >= v:
        return None
    chunks = [VocabChunk(0, width)]
    start = width
    while start < v:
        end = min(width + h * start // n, v)
        w = end - start if end == v else (end - start) // multiple * multiple
        if w <= 0 or len(chunks) >= KEPT_MAX_CHUNKS:
            return None
        chunks.append(VocabChunk(start, w, True, offset=n * (start - width)))
        start += w
    pass2 = tuple(c._replace(reuse=True) for c in reversed(chunks))
    return VocabGeometry(tuple(chunks), pass2)


def vocab_geometry(
    n: int, h: int, v: int, width: int, scratch: bool, multiple: int = 128, keep: bool = True
) -> VocabGeometry:
    """The chunks of a call with ``n`` rows, hidden ``h``, ``v`` columns, a budget buffer of ``width`` columns;
    ``scratch``: dW [V, H] (same dtype as the logits) is computed and may hold logits (see the module doc);
    ``keep``: the kept geometry where it applies (False: only pass 1's last chunk kept)."""
    width = max(min(width, v), 1)
    if not scratch or n <= 0 or h <= 0:
        return plain_geometry(v, width)
    kept = kept_geometry(n, h, v, width, multiple) if keep else None
    if kept is not None:
        return kept
    last = min(v * h // (n + h) // multiple * multiple, v)
    if last <= width:
        return plain_geometry(v, width)
    head_cap = max(v * h // n // multiple * multiple, multiple)
    pass1 = [VocabChunk(s, w, True) for s, w in _even(0, v - last, head_cap, multiple)]
    pass1.append(VocabChunk(v - last, last, True))
    pass2 = [VocabChunk(v - last, last, True, True)]
    end = v - last
    while end > 0:
        start = math.ceil(math.ceil(n * end / (n + h)) / multiple) * multiple
        if end - start < width:
            break
        pass2.append(VocabChunk(start, end - start, True))
        end = start
    pass2 += [VocabChunk(s, w) for s, w in reversed(_even(0, end, width, multiple))]
    return VocabGeometry(tuple(pass1), tuple(pass2))


def _region(c: VocabChunk, n: int) -> tuple[int, int]:
    return c.offset, c.offset + n * c.width


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def fits(geometry: VocabGeometry, n: int, h: int, v: int) -> bool:
    """The invariants (used by the tests): the two passes cover the columns exactly once each; every scratch chunk's
    logits lie in dW's storage and, in pass 2, below the dW rows that chunk writes; logits that pass 2 reuses are
    not overwritten in between (by a later pass-1 chunk, by an earlier pass-2 chunk's recomputed logits or dW
    rows); pass 2 reuses only what pass 1 computed."""
    for chunks in (geometry.pass1, geometry.pass2):
        cols = sorted((c.start, c.width) for c in chunks)
        ends = [a + w for a, w in cols]
        if not cols or cols[0][0] != 0 or ends[-1] != v or ends[:-1] != [a for a, _ in cols[1:]]:
            return False
    if any(c.scratch and (c.offset < 0 or _region(c, n)[1] > v * h) for c in geometry.pass1):
        return False
    if any(c.scratch and _region(c, n)[1] > c.start * h for c in geometry.pass2):
        return False
    stored = {c.start: (i, c) for i, c in enumerate(geometry.pass1)}
    for j, c in enumerate(geometry.pass2):
        if not c.reuse:
            continue
        i, kept = stored.get(c.start, (None, None))
        if kept is None or kept != c._replace(reuse=False):
            return False
        later = geometry.pass1[i + 1 :]
        earlier = [e for e in geometry.pass2[:j] if not e.reuse]
        same_place = [o for o in (*later, *earlier) if o.scratch == c.scratch]
        if any(_overlap(_region(o, n), _region(c, n)) for o in same_place):
            return False
        if c.scratch and any(
            _overlap((e.start * h, (e.start + e.width) * h), _region(c, n)) for e in geometry.pass2[:j]
        ):
            return False
    return True


# ---------------------------------------------------------------- cost model
# FLCE cost model: predicted ms of the token and the vocabulary strategy from FLOPs and bytes (no benchmarking).
#
# Per GEMM ``C[m, n] = A[m, k] @ B[k, n]`` a roofline at the real chunk shape::
#
#     t = max(2 m n k / (F * e), (m k + k n) s + m n s_out) / B_gemm),   e = d / (d + D0),  d = min(m, n, k)
#
# ``F`` is the dense 16-bit GEMM rate cuBLAS reaches on the card (``PEAKS``), ``e`` a small-dimension efficiency
# times ``UNALIGNED`` when a side is not a multiple of 128, ``B_gemm = 0.7 * B`` the rate at which a GEMM streams
# operands (``B`` = copy bandwidth, read + write). Elementwise passes cost ``bytes / B``. Summed per chunk:
#
# * tokens (``c`` rows, ``ceil(BT / c)`` chunks): logits GEMM [c, V] <- [c, H] [H, V]; the row kernel reads the
#   chunk twice and writes its gradient (3 c V s); dX GEMM [c, H] <- [c, V] [V, H]; dW GEMM [V, H] <- [V, c] [c, H]
#   plus, after the first chunk, the read of the dW accumulator (the read-modify-write: V H s_acc).
# * vocab (``w`` columns, ``ceil(V / w)`` chunks, all BT rows): pass 1 the logits GEMM [BT, w] <- [BT, H] [H, w]
#   and the statistics pass reading it (BT w s); pass 2 (in reverse, the last chunk's logits reused: one logits
#   GEMM fewer) the logits GEMM, the gradient pass reads and writes it (2 BT w s); dX GEMM [BT, H] <- [BT, w] [w, H]
#   with an fp32 output plus the fp32 accumulator's read and write (2 BT H 4); dW GEMM [w, H] <- [w, BT] [BT, H]
#   written once. Its GEMMs at ``VOCAB_GEMM_EFFICIENCY`` of ``F`` (no unaligned factor), ``VOCAB_PASS_OVERHEAD_S``
#   per chunk and pass.
#   With a weight gradient the chunks are those of :func:`vocab_geometry` (the widest in
#   dW's not yet written memory: few, wide chunks, pass 1's last and widest one reused).
# * both: the exact fp32 target logit (``target``), one read of BT hidden and BT weight rows.
#
# The calibration (fitted on the H200) and its residuals per shape are in docs/design/flce-cost-model.md.


@dataclass(frozen=True)
class DevicePeaks:
    """Peak figures of one kind of GPU: ``flops`` 16-bit dense GEMM FLOP/s, ``copy_bw`` bytes/s read + written."""

    name: str
    flops: float
    copy_bw: float


# matched by substring of torch.cuda.get_device_name(); first match wins
PEAKS = (
    DevicePeaks("H200", 700e12, 4.17e12),
    DevicePeaks("H100", 620e12, 3.0e12),
    DevicePeaks("A100", 280e12, 1.7e12),
)
DEFAULT_PEAKS = DevicePeaks("default", 300e12, 2.0e12)
GEMM_BW_FRACTION = 0.7
SMALL_DIM = 32  # D0 of the small-dimension efficiency
UNALIGNED = 0.93  # FLOP rate factor of a GEMM with a side not a multiple of 128
FP32_FLOPS_FRACTION = 0.1
# the vocab strategy's GEMM rate and per-chunk overhead: fitted, see docs/design/flce-cost-model.md
VOCAB_GEMM_EFFICIENCY = 0.97
VOCAB_PASS_OVERHEAD_S = 10e-6
REUSE_LAST_CHUNK = (
    True  # pass 2 starts from the last pass-1 chunk still in the buffer (one logits GEMM fewer)
)


def peaks_for(gpu_name: str | None) -> DevicePeaks:
    """The table row whose name is in ``gpu_name`` (``None`` or no match: the default row)."""
    for row in PEAKS:
        if gpu_name and row.name.lower() in gpu_name.lower():
            return row
    return DEFAULT_PEAKS


def known_peaks(gpu_name: str) -> DevicePeaks:
    """The table row for a GPU a caller names; ValueError naming the known GPUs when no row matches (a name given
    on purpose is never costed for the generic peaks, silently; an unknown *device* is, by `device_peaks`)."""
    row = peaks_for(gpu_name)
    if row is DEFAULT_PEAKS:
        raise ValueError(f"unknown GPU {gpu_name!r}; known: {', '.join(p.name for p in PEAKS)}")
    return row


@torch.compiler.assume_constant_result
def _gpu_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def device_peaks(device_index: int | None = None) -> DevicePeaks:
    """Peaks of a CUDA device (the current one by default); the default row without CUDA."""
    if not torch.cuda.is_available():
        return DEFAULT_PEAKS
    return peaks_for(_gpu_name(torch.cuda.current_device() if device_index is None else device_index))


def peaks_of(device: torch.device) -> DevicePeaks:
    """Peaks of the device a tensor lives on (the default row for a non-CUDA device)."""
    return device_peaks(device.index) if device.type == "cuda" else DEFAULT_PEAKS


@dataclass(frozen=True)
class _Machine:
    flops: float
    gemm_bw: float
    copy_bw: float

    @classmethod
    def of(cls, peaks: DevicePeaks, itemsize: int) -> _Machine:
        flops = peaks.flops * (FP32_FLOPS_FRACTION if itemsize >= 4 else 1.0)
        return cls(flops, peaks.copy_bw * GEMM_BW_FRACTION, peaks.copy_bw)

    def gemm(
        self, m: int, n: int, k: int, s: int, s_out: int | None = None, eff: float = 1.0, unaligned=UNALIGNED
    ) -> float:
        d = min(m, n, k)
        if d <= 0:
            return 0.0
        aligned = 1.0 if m % 128 == n % 128 == k % 128 == 0 else unaligned
        flops = 2.0 * m * n * k / (self.flops * eff * aligned * d / (d + SMALL_DIM))
        moved = ((m * k + k * n) * s + m * n * (s if s_out is None else s_out)) / self.gemm_bw
        return max(flops, moved)

    def stream(self, nbytes: float, rate: float | None = None) -> float:
        return nbytes / (rate or self.copy_bw)


def tokens_ms(
    bt: int, h: int, v: int, chunk: int, itemsize: int, peaks: DevicePeaks, acc_itemsize: int = 0
) -> float:
    """Predicted ms of the token strategy (forward + backward w.r.t. hidden and weight)."""
    if bt <= 0 or chunk <= 0:
        return 0.0
    mach = _Machine.of(peaks, itemsize)
    s, s_acc = itemsize, acc_itemsize or itemsize

    def one(c: int) -> float:
        return (
            mach.gemm(c, v, h, s)
            + mach.stream(3 * c * v * s)
            + mach.gemm(c, h, v, s)
            + mach.gemm(v, h, c, s, s_acc)
            + mach.stream(v * h * s_acc, mach.gemm_bw)
        )

    full, rest = divmod(bt, chunk)
    total = full * one(chunk) + (one(rest) if rest else 0.0) - mach.stream(v * h * s_acc, mach.gemm_bw)
    return total * 1e3 + target_logit_ms(bt, h, s, peaks)


def target_logit_ms(bt: int, h: int, itemsize: int, peaks: DevicePeaks) -> float:
    """The exact fp32 target logit of both strategies (``target``): one read of the hidden rows and of their
    targets' weight rows."""
    return 2 * bt * h * itemsize / peaks.copy_bw * 1e3


def vocab_ms(
    bt: int,
    h: int,
    v: int,
    chunk: int,
    itemsize: int,
    peaks: DevicePeaks,
    scratch: bool = False,
    multiple: int = 128,
    keep: bool = True,
) -> float:
    """Predicted ms of the vocabulary strategy (forward + backward w.r.t. hidden and weight) in the chunks of
    :func:`vocab_geometry` (a budget buffer of ``chunk`` columns; ``scratch``: the widest
    chunks in the weight gradient's memory), pass 2 reusing pass 1's last chunk (``keep``: every chunk where
    ``N <= H``)."""
    if bt <= 0 or chunk <= 0:
        return 0.0
    mach = _Machine.of(peaks, itemsize)
    s = itemsize

    def logits(w: int) -> float:
        return mach.gemm(bt, w, h, s, eff=VOCAB_GEMM_EFFICIENCY, unaligned=1.0)

    def first(w: int) -> float:
        return logits(w) + mach.stream(bt * w * s) + VOCAB_PASS_OVERHEAD_S

    def second(w: int, reuse: bool) -> float:
        return (
            (0.0 if reuse and REUSE_LAST_CHUNK else logits(w))
            + mach.stream(2 * bt * w * s)
            + mach.gemm(bt, h, w, s, 4, eff=VOCAB_GEMM_EFFICIENCY, unaligned=1.0)
            + mach.stream(2 * bt * h * 4)
            + mach.gemm(w, h, bt, s, eff=VOCAB_GEMM_EFFICIENCY, unaligned=1.0)
            + VOCAB_PASS_OVERHEAD_S
        )

    geometry = vocab_geometry(bt, h, v, chunk, scratch, multiple, keep)
    total = sum(first(c.width) for c in geometry.pass1) + sum(
        second(c.width, c.reuse) for c in geometry.pass2
    )
    return total * 1e3 + target_logit_ms(bt, h, s, peaks)


@lru_cache(maxsize=256)
def keeps_every_chunk(
    bt: int, h: int, v: int, chunk: int, itemsize: int, peaks: DevicePeaks, multiple: int = 128
) -> bool:
    """Whether the vocabulary strategy lays its chunks out with every chunk's logits kept for pass 2
    (:func:`kept_geometry`, ``N <= H``): where that layout applies, when it is predicted
    faster than keeping pass 1's last chunk only. It saves logits GEMMs but needs more chunks as N nears H (the
    widths grow by H / N); docs/design/flce-layouts.md has how the two layouts compared on the H200."""
    ms = (vocab_ms(bt, h, v, chunk, itemsize, peaks, True, multiple, keep=k) for k in (True, False))
    return next(ms) < next(ms)


# ---------------------------------------------------------------- plan
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
    the ``widest`` of them in the weight gradient's not yet written memory (:func:`vocab_geometry`), the
    rest in the buffer of ``chunk_vocab`` columns; pass 2 computes the logits of ``recomputed`` columns again (0:
    every chunk kept from pass 1).

    What the plan costs beyond its buffer (:func:`plan_memory`): ``gemms`` the [N, H, V]-sized GEMMs it runs (3,
    the floor, for the token strategy with a weight gradient: logits, dX, dW; the vocab strategy adds its
    ``recomputed`` columns' logits; ``reduction="none"`` one logits GEMM more, its gradients being formed in the
    backward); ``held_mib`` the gradients formed in the forward and held until the backward scales them (dW in
    the weight's dtype + dX; 0 with ``reduction="none"``, whose backward forms them); ``peak_mib`` the head's
    predicted peak above its inputs (dW + dX + buffer; the vocab strategy: dW + its fp32 dX accumulator +
    max(buffer, dX), docs/design/head-memory.md)."""

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
    gemms: float = 3.0
    held_mib: float = 0.0
    peak_mib: float = 0.0

    @property
    def chunk(self) -> int:
        """The chunk length along the strategy's axis (rows for tokens, columns for vocab)."""
        return self.chunk_tokens if self.strategy == "tokens" else self.chunk_vocab

    def __str__(self) -> str:
        cost = (
            f"{self.gemms:.2f} head-sized GEMMs, gradients held forward to backward {self.held_mib:.1f} MiB, "
            f"peak ~{self.peak_mib:.1f} MiB above inputs, ~{self.predicted_ms:.1f} ms on {self.device} ({self.why})"
        )
        if self.scratch:
            return (
                f"vocab: {self.pass1_chunks} + {self.num_chunks} chunks (pass 1 + pass 2), up to {self.widest} "
                f"columns in dW's memory, {self.recomputed} recomputed, buffer {self.buffer_mib:.1f} of "
                f"{self.budget_mib:.1f} MiB, {cost}"
            )
        return (
            f"{self.strategy}: {self.num_chunks} x [{self.chunk_tokens}, {self.chunk_vocab}] logits chunks, buffer "
            f"{self.buffer_mib:.1f} of {self.budget_mib:.1f} MiB, {cost}"
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
# H200 (docs/design/flce-cost-model.md)
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
    grads_in_forward: bool = True,
    acc_itemsize: int = 0,
) -> FlcePlan:
    plan = _choose(bt, h, v, chunk_mem_const, max_chunk_mib, strategy, itemsize, peaks, align, weight_grad)
    gemms, held, peak = plan_memory(plan, bt, h, v, itemsize, weight_grad, grads_in_forward, acc_itemsize)
    why = plan.why if grads_in_forward else f"{plan.why}; {PER_TOKEN_GRADS}"
    return replace(plan, gemms=gemms, held_mib=held, peak_mib=peak, why=why)


# why a reduction="none" call forms its gradients in the backward (FusedLinearCrossEntropyFunction)
PER_TOKEN_GRADS = (
    "reduction=none: gradients formed in the backward from the per-token grad_output, one logits GEMM more "
    "(a gradient formed in the forward cannot take it: dW sums g_i * G_i^T x_i over the tokens)"
)


def plan_memory(
    plan: FlcePlan,
    bt: int,
    h: int,
    v: int,
    itemsize: int,
    weight_grad: bool = True,
    grads_in_forward: bool = True,
    acc_itemsize: int = 0,
) -> tuple[float, float, float]:
    """``(gemms, held_mib, peak_mib)`` of a plan (see :class:`FlcePlan`). ``acc_itemsize``: the token strategy's
    dW accumulator (``accum_dtype``; 0: the weight's dtype), cast to the weight's dtype at the end (both alive
    then); the vocab strategy writes each dW row once, in the logits' dtype."""
    dw = v * h * itemsize if weight_grad else 0
    dx = bt * h * itemsize
    buffer = plan.buffer_mib * MIB
    gemms = (3.0 if weight_grad else 2.0) + (0.0 if grads_in_forward else 1.0)
    if plan.strategy == "vocab":
        gemms += plan.recomputed / v if v else 0.0
        peak = dw + bt * h * 4 + max(buffer, dx)
    else:
        acc = v * h * acc_itemsize if weight_grad and acc_itemsize not in (0, itemsize) else 0
        peak = dw + acc + dx + buffer
    held = dw + dx if grads_in_forward else 0
    return gemms, held / MIB, peak / MIB


def _choose(
    bt, h, v, chunk_mem_const, max_chunk_mib, strategy, itemsize, peaks: DevicePeaks, align: int, weight_grad
) -> FlcePlan:
    budget, cmc = _budget_bytes(bt, h, v, chunk_mem_const, max_chunk_mib, itemsize)
    rows = _tokens_chunk(bt, h, v, itemsize, cmc, budget)
    cols = _vocab_chunk(bt, v, itemsize, budget, align) if bt else None
    t_ms = tokens_ms(bt, h, v, rows, itemsize, peaks) if rows is not None else None
    multiple = min(COL_MULTIPLE, align)
    keeps = _uncached(keeps_every_chunk)
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
    reduction: str = "mean",
    accum_dtype: torch.dtype | None = None,
) -> FlcePlan:
    """The plan of an FLCE call on ``bt`` tokens, hidden ``h``, vocabulary ``v`` (logits in ``dtype``).

    Budget of the logits buffer: ``max_chunk_mib`` MiB, else the C=``chunk_mem_const`` (default 1) token chunk's
    buffer ``chunk_tokens(C) * V * itemsize`` of :func:`flce_chunk_geometry`; no strategy exceeds it.
    ``tokens`` with a chunk_mem_const budget is today's geometry exactly; with a MiB budget the largest multiple
    of 128 rows that fits. ``vocab``: all rows, V in the fewest even chunks (widths a multiple of 8, at least 128
    columns) that fit (infeasible -> tokens, said in ``why``). ``auto`` takes the cheaper by the cost model on ``gpu`` (a CUDA device name;
    default: the current CUDA device, or the table's default row without CUDA). ``weight_grad``: the weight
    gradient is computed (its memory holds the vocab strategy's widest chunks until written; False: a frozen
    head, budget-buffer chunks only). ``reduction`` and ``accum_dtype`` (the call's) change what the plan says it
    costs (``gemms``, ``held_mib``, ``peak_mib``; ``reduction="none"`` forms the gradients in the backward), not
    the layout.
    """
    _check_shape(bt, h, v)
    if budget_knob(chunk_mem_const, max_chunk_mib) == "chunk_mem_const":
        check_chunk_mem_const(chunk_mem_const)
    mib = None if max_chunk_mib is None else check_max_chunk_mib(max_chunk_mib)
    check_strategy(strategy)
    check_reduction(reduction)
    peaks = device_peaks() if gpu is None else known_peaks(gpu)
    knobs = (chunk_mem_const, mib, strategy, dtype.itemsize, peaks, VOCAB_ALIGN, bool(weight_grad))
    return _plan(bt, h, v, *knobs, reduction != "none", _acc_itemsize(accum_dtype))


def _acc_itemsize(accum_dtype: torch.dtype | None) -> int:
    return 0 if accum_dtype is None else accum_dtype.itemsize


def plan_for(
    bt: int, h: int, v: int, options, dtype: torch.dtype, device: torch.device, weight_grad: bool = True
) -> FlcePlan:
    """The plan of a call whose :class:`FlceOptions` are already validated (no second validation, cached)."""
    peaks = peaks_of(device)
    plan = _uncached(_plan)
    knobs = (options.chunk_mem_const, options.max_chunk_mib, options.strategy)
    forward = options.reduction != "none"
    acc = _acc_itemsize(options.accum_dtype)
    return plan(bt, h, v, *knobs, dtype.itemsize, peaks, VOCAB_ALIGN, weight_grad, forward, acc)
