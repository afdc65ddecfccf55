"""Question: How much of the MoE search's compile time do threads overlap?
Answer recorded in docs/design/moe-experts.md.

The search compiles its candidates side by side before timing them (``tuning.compile_side_by_side``).

No GPU needed: every candidate tile config of the rows kernel's chosen modes (kernels/moe/tuning.py) compiled for
sm_90 (``benchmarks.probes.ptxas.compile_rows``), once one after the other and once over ``--threads`` threads,
threads first, each run with its own empty Triton cache. One untimed compile before both loads the compiler.

Usage (without TRITON_INTERPRET): python -m benchmarks.probes.compile_threads [--shape qwen3|gpt_oss]
    [--modes 0,1] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.probes import ptxas
from liger_registry.kernels.triton_utils import INTERPRET_AT_IMPORT


def compile_all(jobs, shape, threads: int) -> float:
    """Seconds to compile every (mode, config) of ``jobs`` into a fresh cache over ``threads`` threads."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_threads-")
    start = time.perf_counter()
    if threads <= 1:
        for mode, cfg in jobs:
            ptxas.compile_rows(mode, cfg, shape, 90, False)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(lambda job: ptxas.compile_rows(job[0], job[1], shape, 90, False), jobs))
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=sorted(ptxas.SHAPES), default="qwen3")
    p.add_argument("--modes", default="0,1")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    if INTERPRET_AT_IMPORT:
        raise SystemExit(
            "probe compile_threads: run without TRITON_INTERPRET (the kernels compile for sm_90)"
        )
    shape = ptxas.SHAPES[args.shape]
    jobs = [(m, c) for m in map(int, args.modes.split(",")) for c in ptxas.candidates(m, shape, 128)]
    compile_all(jobs[:1], shape, 1)
    threaded = compile_all(jobs, shape, args.threads)
    serial = compile_all(jobs, shape, 1)
    print(f"{args.shape} modes {args.modes}: {len(jobs)} configs for sm_90 on {os.cpu_count()} CPUs")
    print(
        f"  one after the other {serial:.2f} s, {args.threads} threads {threaded:.2f} s: {serial / threaded:.2f}x"
    )


if __name__ == "__main__":
    main()
