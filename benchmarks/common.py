"""Shared helpers of the GPU benchmarks: timing (median of triton.testing.do_bench), incremental peak memory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def out_dir() -> Path:
    d = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    d.mkdir(parents=True, exist_ok=True)
    return d


def median_ms(fn, grad_to_none=None, warmup=100, rep=400) -> float:
    import triton.testing

    return float(
        triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")
    )


def incremental_peak_mib(fn, clear=()) -> float:
    """max_memory_allocated during one call of fn minus what was allocated before it (inputs excluded)."""
    for t in clear:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    for t in clear:
        t.grad = None
    return peak / 2**20


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth, counting bytes read + written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def env_info() -> dict:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
    try:
        from importlib.metadata import version

        import liger_kernel  # noqa: F401

        info["liger_kernel"] = version("liger-kernel")
    except Exception as e:  # noqa: BLE001
        info["liger_kernel"] = f"unavailable: {e!r}"
    return info


def write_json(name: str, payload: dict) -> Path:
    path = out_dir() / name
    path.write_text(json.dumps(payload, indent=1))
    return path


def kernel_ms(fn, grads=(), iters: int = 5, label: str = "") -> float:
    """Sum of GPU kernel (and memcpy/memset) time per call, from the profiler: tells launch/CPU overhead apart."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        for t in grads:
            t.grad = None
        fn()

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    if label:
        print(f"--- kernels of {label} (per {iters} steps)")
        try:
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=8))
        except Exception as e:  # noqa: BLE001
            print("profiler table unavailable:", repr(e))
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
    return total / 1000.0 / iters
