"""FLCE cost model: predicted ms of the token and the vocabulary strategy from FLOPs and bytes (no benchmarking).

Per GEMM ``C[m, n] = A[m, k] @ B[k, n]`` a roofline at the real chunk shape::

    t = max(2 m n k / (F * e), (m k + k n) s + m n s_out) / B_gemm),   e = d / (d + D0),  d = min(m, n, k)

``F`` is the dense 16-bit GEMM rate cuBLAS reaches on the card (``PEAKS``), ``e`` a small-dimension efficiency
times ``UNALIGNED`` when a side is not a multiple of 128, ``B_gemm = 0.7 * B`` the rate at which a GEMM streams
operands (``B`` = copy bandwidth, read + write). Elementwise passes cost ``bytes / B``. Summed per chunk:

* tokens (``c`` rows, ``ceil(BT / c)`` chunks): logits GEMM [c, V] <- [c, H] [H, V]; the row kernel reads the
  chunk twice and writes its gradient (3 c V s); dX GEMM [c, H] <- [c, V] [V, H]; dW GEMM [V, H] <- [V, c] [c, H]
  plus, after the first chunk, the read of the dW accumulator (the read-modify-write: V H s_acc).
* vocab (``w`` columns, ``ceil(V / w)`` chunks, all BT rows): pass 1 the logits GEMM [BT, w] <- [BT, H] [H, w]
  and the statistics pass reading it (BT w s); pass 2 (in reverse, the last chunk's logits reused: one logits
  GEMM fewer) the logits GEMM, the gradient pass reads and writes it (2 BT w s); dX GEMM [BT, H] <- [BT, w] [w, H]
  with an fp32 output plus the fp32 accumulator's read and write (2 BT H 4); dW GEMM [w, H] <- [w, BT] [BT, H]
  written once. Its GEMMs at ``VOCAB_GEMM_EFFICIENCY`` of ``F`` (no unaligned factor), ``VOCAB_PASS_OVERHEAD_S``
  per chunk and pass.
  With a weight gradient the chunks are those of :func:`vocab_geometry.vocab_geometry` (the widest in
  dW's not yet written memory: few, wide chunks, pass 1's last and widest one reused).
* both: the exact fp32 target logit (``target``), one read of BT hidden and BT weight rows.

The calibration (fitted on the H200 against ANCHORS.md and bench_flce) and its residuals per shape are in
benchmarks/NOTES.md, "FLCE cost model: calibration".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .vocab_geometry import vocab_geometry


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
# the vocab strategy's GEMM rate and per-chunk overhead: fitted, see NOTES.md ("FLCE cost model: calibration")
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
    :func:`vocab_geometry.vocab_geometry` (a budget buffer of ``chunk`` columns; ``scratch``: the widest
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
    (:func:`vocab_geometry.kept_geometry`, ``N <= H``): where that layout applies, when it is predicted
    faster than keeping pass 1's last chunk only. It saves logits GEMMs but needs more chunks as N nears H (the
    widths grow by H / N); NOTES.md (session 6) has how the two layouts compared on the H200."""
    ms = (vocab_ms(bt, h, v, chunk, itemsize, peaks, True, multiple, keep=k) for k in (True, False))
    return next(ms) < next(ms)
