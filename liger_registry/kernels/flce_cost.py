"""FLCE cost model: predicted ms of the token and the vocabulary strategy from FLOPs and bytes (no benchmarking).

Per GEMM ``C[m, n] = A[m, k] @ B[k, n]`` a roofline at the real chunk shape::

    t = max(2 m n k / (F * e), (m k + k n) s + m n s_out) / B_gemm),   e = d / (d + D0),  d = min(m, n, k)

``F`` is the dense 16-bit GEMM rate cuBLAS reaches on the card (H200: ~700 TFLOP/s measured here), ``e`` a
small-dimension efficiency (a GEMM with a 256-row side runs at ~89% of it; fitted to ANCHORS.md's chunk-256
split) times 0.93 when a side is not a multiple of 128 (GPT-OSS's H=2880 3-GEMM floor: 10.9 ms, not 10.2), ``B_gemm = 0.7 * B`` the rate at which a GEMM streams operands (``B`` = copy bandwidth, read + write;
a skinny GEMM re-reading the weight measured ~1.4 ms per GiB pair at chunk 64). Elementwise passes cost
``bytes / B``. Summed per chunk:

* tokens (``c`` rows, ``ceil(BT / c)`` chunks): logits GEMM [c, V] <- [c, H] [H, V]; the row kernel reads the
  chunk twice and writes its gradient (3 c V s); dX GEMM [c, H] <- [c, V] [V, H]; dW GEMM [V, H] <- [V, c] [c, H]
  plus, after the first chunk, the read of the dW accumulator (the read-modify-write: V H s_acc).
* vocab (``w`` columns, ``ceil(V / w)`` chunks, all BT rows): pass 1 the logits GEMM [BT, w/2] <- [BT, H] [H, w/2]
  with fp32 output (the same bytes) and the statistics pass reading it (BT w/2 4); pass 2 the logits GEMM again
  [BT, w] in the input dtype, the gradient pass reads and writes it (2 BT w s); dX GEMM
  [BT, H] <- [BT, w] [w, H] with an fp32 output plus the fp32 accumulator's read (BT H 4, GEMM epilogue rate);
  dW GEMM [w, H] <- [w, BT] [BT, H] written once.

Calibrated on ANCHORS.md (H200, bf16, C=1 budget; ``benchmarks/flce_plan_table.py`` prints the table).
Llama-3 (H=4096 V=128256) at BT 2048 / 4096 / 8192 / 16384: tokens 46.6 / 47.6 / 54.2 / 92.6 ms predicted vs
45.3 / 45.2 / 55.1 / 90.7 measured; vocab 13.6 / 27.1 / 54.2 / 108.3 vs the lower bound 13.8 / 27.5 / 53.9 /
108.3. GPT-OSS (H=2880 V=201088): tokens 102.6 / 104.1 / 107.0 / 128.1 vs 101.9 / 103.9 / 108.8 / 124.5;
vocab 16.1 / 32.2 / 64.4 / 128.8 vs 17.6 / 31.8 / 63.6 / 126.0. Llama BT 8192 is a tie (54.2 / 54.2
predicted, 55.1 / 53.9 measured), as is GPT-OSS BT 16384 (128.1 / 128.8; 124.5 / 126.0).
C=8 tokens: 11.3 / 20.9 / 40.1 / 78.5 vs 11.5 / 21.6 / 41.3 / 79.4. fp32 GEMMs (no TF32) run at ``F / 10``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
UNALIGNED = (
    0.93  # FLOP rate factor of a GEMM with a side not a multiple of 128 (GPT-OSS H=2880: floor 10.9 ms)
)
FP32_FLOPS_FRACTION = 0.1


def peaks_for(gpu_name: str | None) -> DevicePeaks:
    """The table row whose name is in ``gpu_name`` (``None`` or no match: the default row)."""
    for row in PEAKS:
        if gpu_name and row.name.lower() in gpu_name.lower():
            return row
    return DEFAULT_PEAKS


@torch.compiler.assume_constant_result
def _gpu_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def device_peaks(device_index: int | None = None) -> DevicePeaks:
    """Peaks of a CUDA device (the current one by default); the default row without CUDA."""
    if not torch.cuda.is_available():
        return DEFAULT_PEAKS
    return peaks_for(_gpu_name(torch.cuda.current_device() if device_index is None else device_index))


@dataclass(frozen=True)
class _Machine:
    flops: float
    gemm_bw: float
    copy_bw: float

    @classmethod
    def of(cls, peaks: DevicePeaks, itemsize: int) -> _Machine:
        flops = peaks.flops * (FP32_FLOPS_FRACTION if itemsize >= 4 else 1.0)
        return cls(flops, peaks.copy_bw * GEMM_BW_FRACTION, peaks.copy_bw)

    def gemm(self, m: int, n: int, k: int, s: int, s_out: int | None = None) -> float:
        d = min(m, n, k)
        if d <= 0:
            return 0.0
        aligned = 1.0 if m % 128 == n % 128 == k % 128 == 0 else UNALIGNED
        flops = 2.0 * m * n * k / (self.flops * aligned * d / (d + SMALL_DIM))
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
    return total * 1e3


def vocab_ms(bt: int, h: int, v: int, chunk: int, itemsize: int, peaks: DevicePeaks) -> float:
    """Predicted ms of the vocabulary strategy (forward + backward w.r.t. hidden and weight)."""
    if bt <= 0 or chunk <= 0:
        return 0.0
    mach = _Machine.of(peaks, itemsize)
    s = itemsize
    s1 = max(s, 4)  # pass 1 writes fp32 logits (cuBLAS out_dtype) in half-width chunks of the same bytes

    def first(w: int) -> float:
        return mach.gemm(bt, w, h, s, s1) + mach.stream(bt * w * s1)

    def second(w: int) -> float:
        return (
            mach.gemm(bt, w, h, s)
            + mach.stream(2 * bt * w * s)
            + mach.gemm(bt, h, w, s, 4)
            + mach.stream(bt * h * 4, mach.gemm_bw)
            + mach.gemm(w, h, bt, s)
        )

    return (_over(v, max(chunk * s // s1, 1), first) + _over(v, chunk, second)) * 1e3


def _over(v: int, width: int, cost) -> float:
    full, rest = divmod(v, width)
    return full * cost(width) + (cost(rest) if rest else 0.0)
