"""Small helpers shared by the Triton kernels (block sizes, warps, an exp-based tanh that the interpreter runs)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# Upper bound of the column block of the row kernels. Tests lower it so that tiny shapes cross block
# boundaries; on the GPU it is the tuned value.
MAX_BLOCK = 32768
# How the row kernels run their statistics pass (``triton_row_stats.row_stats``): per-lane state ("lanes") or
# block reductions ("blocks"), and the largest column block. Lanes keep three live vectors per thread (32768
# spills). H200 run 13 (benchmarks/probe_row_stats.py, ms): the vocab statistics kernel on 8192 x 42752 lanes
# 2048 0.228 vs blocks 32768 (the old pass) 0.451; the CE rows kernel on a GPT-OSS token chunk 1280 x 201088
# blocks 8192 0.436 vs lanes 2048 0.464 vs blocks 32768 0.483, and on 4096 x 128256 0.826 / 0.804 / 0.793.
ROW_STATS = {"ce_rows": ("blocks", 8192), "vocab_stats": ("lanes", 2048)}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# triton.jit decides at decoration time whether a kernel runs in the interpreter: what counts is the value
# of TRITON_INTERPRET when these modules were imported.
INTERPRET_AT_IMPORT = interpreting()


def row_block(n_cols: int, max_block: int | None = None) -> int:
    cap = MAX_BLOCK if max_block is None else max_block
    return max(16, min(cap, triton.next_power_of_2(n_cols)))


def row_stats_config(kernel: str, n_cols: int) -> tuple[bool, int]:
    """``(lanes, block)`` of a row kernel's statistics pass (``ROW_STATS``), the block capped by MAX_BLOCK."""
    mode, cap = ROW_STATS[kernel]
    return mode == "lanes", row_block(n_cols, min(MAX_BLOCK, cap))


def warps_for(block: int) -> int:
    if block >= 32768:
        return 32
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host (``triton.cdiv`` is a constexpr function in triton 3.9: ~7 us per host call)."""
    return -(-a // b)


def contiguous_rows(x: torch.Tensor) -> torch.Tensor:
    """x viewed as [rows, cols] with unit column stride (copies only when it must)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@triton.jit
def tanh(u):
    a = tl.abs(u)
    e = tl.exp(-2.0 * a)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(u < 0, -t, t)


# Online log-sum-exp kept per lane: no block-wide reduction inside the column loop (two per block cost more
# than the memory traffic), one exp per element, reduced once per row. ``m`` starts at LANES_M0 (finite, so a
# lane that has only seen masked -inf columns adds exp(-inf) = 0 instead of exp(nan)).
LANES_M0 = tl.constexpr(-1.0e30)


@triton.jit
def lse_lanes_update(m, d, z):
    """Fold the block ``z`` (-inf where masked) into the per-lane running max ``m`` and sum ``d`` of exp(z - m)."""
    diff = z - m
    e = tl.exp(-tl.abs(diff))
    d = tl.where(diff > 0, d * e + 1.0, d + e)
    return tl.maximum(m, z), d


@triton.jit
def lse_lanes_finish(m, d):
    """The row's max and sum of exp(z - max) from the per-lane state."""
    mx = tl.max(m, 0)
    return mx, tl.sum(d * tl.exp(m - mx), 0)


@triton.jit
def argmax_lanes_update(best, best_i, z, cols):
    """Per-lane running max and its first column (strict >: the earliest column wins a tie)."""
    better = z > best
    return tl.where(better, z, best), tl.where(better, cols, best_i)


@triton.jit
def argmax_lanes_finish(best, best_i, n_cols):
    """The row's max and its first column (the smallest column among the lanes that hold the max)."""
    mx = tl.max(best, 0)
    return mx, tl.min(tl.where(best == mx, best_i, n_cols), 0)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (looked up once per device)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def row_programs(n_rows: int, device: torch.device) -> tuple[int, int]:
    """``(programs, rows per program)`` of a row-looping backward: a few programs per SM, each keeping one
    partial weight-gradient row (4 programs on the CPU interpreter)."""
    progs = min(n_rows, 4 * sm_count(device)) if device.type == "cuda" else min(n_rows, 4)
    progs = max(progs, 1)
    return progs, cdiv(n_rows, progs)
