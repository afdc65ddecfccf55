"""Question: Which MoE rows kernel configurations spill or leave their loads unpipelined on the GPU target?
Answer recorded in docs/design/moe-experts.md.

No GPU needed: the MoE rows kernel compiled ahead of time for a GPU target (sm_90 by
default) in every mode x candidate tile config (kernels/moe/tuning.py), with what ptxas reports: registers per thread, spill stores, shared
memory, and whether the K loop's loads are pipelined (async copies) and run on wgmma. A config that spills in the
epilogue or leaves its loads unpipelined is one the autotuner should not need; this shows it on a CPU box.

Integer arguments are compiled as the JIT specialises them on a GPU (strides and sizes divisible by 16, pointers
16-byte aligned). Needs the installed triton's ptxas (shipped with its CUDA backend).

Usage (without TRITON_INTERPRET): python -m benchmarks.probes.ptxas [--arch 90] [--shape qwen3|gpt_oss] [--modes 0,1,2,3]
    [--bm 128] [--persistent]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from liger_registry.kernels.glu.triton_kernels import _KINDS as ACT_CODES
from liger_registry.kernels.moe import triton_kernels as tk
from liger_registry.kernels.moe import tuning
from liger_registry.kernels.triton_utils import INTERPRET_AT_IMPORT

MODES = {
    tk.GLU_FWD: "GLU_FWD",
    tk.SCATTER_WEIGHTED: "SCATTER_WEIGHTED",
    tk.GLU_BWD: "GLU_BWD",
    tk.SCATTER: "SCATTER",
}
SHAPES = {  # the epilogue's options of each family's gate: act, interleaved pairs (STEP 2), biases; its sizes
    "qwen3": dict(act="swiglu", step=1, bias=False, hidden=2048, inter=768, experts=128, rows=32768),
    "gpt_oss": dict(act="clamped_swiglu", step=2, bias=True, hidden=2880, inter=2880, experts=32, rows=16384),
}
POINTERS = {"A", "A_IDX", "B", "B2", "BIAS", "C", "C2", "DEST", "W", "AUX", "PART", "COPY", "BLOCKS"}
INDEX_POINTERS = {"A_IDX", "DEST", "BLOCKS"}
FP32_POINTERS = {"PART", "W"}


def _signature(names: list[str], constexprs: dict) -> dict[str, str]:
    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name in POINTERS:
            return "*i32" if name in INDEX_POINTERS else "*fp32" if name in FP32_POINTERS else "*bf16"
        return "fp32" if name in ("limit", "alpha") else "i32"

    return {n: kind(n) for n in names}


def candidates(mode: int, shape: dict, bm: int) -> list[tuning.TileConfig]:
    """The tile configs the tuner tries for this mode at this shape."""
    glu = mode in (tk.GLU_FWD, tk.GLU_BWD)
    n, k = (shape["inter"], shape["hidden"]) if glu else (shape["hidden"], shape["inter"])
    k = 2 * k if mode == tk.SCATTER else k
    rows_shape = tuning.RowsShape(mode, n, k, shape["rows"], shape["experts"], bm, shape["step"])
    return tuning.rows_candidates(rows_shape)


def compile_rows(
    mode: int, config: tuning.TileConfig, shape: dict, arch: int, copy: bool, bm: int = 128, persistent=False
):
    """The compiled kernel for one mode and config (bf16 activations, gathered A rows in the GLU modes)."""
    fn = tk._rows_kernel
    names = fn.arg_names
    constexprs = dict(
        MODE=mode, HAS_IDX=mode in (tk.GLU_FWD, tk.GLU_BWD), HAS_BIAS=shape["bias"] and mode != tk.GLU_BWD,
        HAS_COPY=copy, ACT=ACT_CODES[shape["act"]], UP_OFF=1 if shape["step"] == 2 else 768, STEP=shape["step"],
        SPLIT=False, PREC="tf32", BM=bm, PERSISTENT=persistent, **dict(config.meta),
    )  # fmt: skip
    sig = _signature(names, constexprs)
    aligned = [n for n in names if sig[n].startswith("*") or n.startswith("stride") or n in ("N", "K")]
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def ptxas_report(kernel, arch: int) -> str:
    ptxas = get_ptxas(arch)
    ptxas = getattr(ptxas, "path", ptxas)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        suffix = "a" if arch == 90 else ""
        run = subprocess.run([ptxas, f"-arch=sm_{arch}{suffix}", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)  # fmt: skip
    regs = re.search(r"Used (\d+) registers", run.stderr)
    spills = re.search(r"(\d+) bytes spill stores", run.stderr)
    return f"regs {regs.group(1) if regs else '?':>3}  spill stores {spills.group(1) if spills else '?':>5} B"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3")
    p.add_argument("--modes", default="0,1,2,3")
    p.add_argument("--bm", type=int, default=128, help="rows per block (the routing table's: 64 or 128)")
    p.add_argument("--persistent", action="store_true", help="the persistent schedule (tuning.PERSISTENT)")
    args = p.parse_args()
    if INTERPRET_AT_IMPORT:
        raise SystemExit("probe_ptxas: run without TRITON_INTERPRET (the kernels compile for the GPU target)")
    shape = SHAPES[args.shape]
    print(
        f"_rows_kernel for sm_{args.arch}, {args.shape} epilogue {shape}, BM {args.bm}, triton {triton.__version__}"
    )
    for mode in map(int, args.modes.split(",")):
        configs = candidates(mode, shape, args.bm)
        for copy in (False, True) if mode == tk.GLU_BWD else (False,):
            for c in configs:
                kernel = compile_rows(mode, c, shape, args.arch, copy, args.bm, args.persistent)
                ir = kernel.asm["ttgir"]
                label = f"{MODES[mode]}{' +copy' if copy else ''}"
                print(
                    f"  {label:17s} BN {c['BN']:3d} BK {c['BK']:3d} warps {c.num_warps} "
                    f"stages {c.num_stages}: {ptxas_report(kernel, args.arch)}  shared {kernel.metadata.shared:6d}"
                    f"  async copies {ir.count('async_copy_global_to_local')}  wgmma {ir.count('warp_group_dot ')}"
                )


if __name__ == "__main__":
    main()
