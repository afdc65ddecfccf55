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


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# triton.jit decides at decoration time whether a kernel runs in the interpreter: what counts is the value
# of TRITON_INTERPRET when these modules were imported.
INTERPRET_AT_IMPORT = interpreting()


def row_block(n_cols: int, max_block: int | None = None) -> int:
    cap = MAX_BLOCK if max_block is None else max_block
    return max(16, min(cap, triton.next_power_of_2(n_cols)))


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
