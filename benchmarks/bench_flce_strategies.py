"""FLCE strategies on the GPU: each strategy forced, measured against the planner's prediction (calibration).

For the ANCHORS.md shapes (bf16, forward + backward w.r.t. hidden and weight, random inputs) and the C=1 /
C=8 / 512 MiB budgets: median ms and incremental peak MiB of ``strategy="tokens"`` and ``"vocab"``, the
cost model's ms for each, and the strategy ``auto`` picks. JSON under benchmarks/results/.
Usage: python benchmarks/bench_flce_strategies.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import env_info, incremental_peak_mib, median_ms, write_json  # noqa: E402

from liger_registry import kernels as K  # noqa: E402
from liger_registry.kernels.flce.cost import device_peaks, tokens_ms, vocab_ms  # noqa: E402

SHAPES = {"llama3": (4096, 128256), "gpt-oss": (2880, 201088)}
BUDGETS = {"C=1": {"chunk_mem_const": 1}, "C=8": {"chunk_mem_const": 8}, "512MiB": {"max_chunk_mib": 512}}


def _data(bt, h, v):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    x = torch.randn(bt, h, device="cuda", generator=g).bfloat16().requires_grad_()
    return x, w, torch.randint(0, v, (bt,), device="cuda", generator=g)


def measure(shape: str, bt: int, h: int, v: int, peaks) -> list[dict]:
    x, w, t = _data(bt, h, v)
    rows = []
    for label, knobs in BUDGETS.items():
        auto = K.flce_plan(bt, h, v, **knobs)
        for strategy in ("tokens", "vocab"):
            plan = K.flce_plan(bt, h, v, strategy=strategy, **knobs)
            if plan.strategy != strategy:
                continue

            def step(strategy=strategy, knobs=knobs):
                K.fused_linear_cross_entropy(x, w, t, strategy=strategy, **knobs).backward()

            step()
            ms = median_ms(step, grad_to_none=[x, w])
            mib = incremental_peak_mib(step, clear=[x, w])
            pred = (tokens_ms if strategy == "tokens" else vocab_ms)(bt, h, v, plan.chunk, 2, peaks)
            rows.append(
                {
                    "shape": shape,
                    "bt": bt,
                    "budget": label,
                    "strategy": strategy,
                    "ms": ms,
                    "predicted_ms": pred,
                    "peak_mib": mib,
                    "auto": auto.strategy,
                    "plan": str(plan),
                }
            )
            print(
                f"{shape:<8} {bt:>6} {label:>7} {strategy:>6}: {ms:7.2f} ms (model {pred:6.1f}) "
                f"{mib:8.0f} MiB  auto={auto.strategy}",
                flush=True,
            )
    return rows


def main() -> None:
    quick = "--quick" in sys.argv
    peaks = device_peaks()
    rows = []
    for shape, (h, v) in SHAPES.items():
        for bt in (2048, 4096) if quick else (2048, 4096, 8192, 16384):
            rows += measure(shape, bt, h, v, peaks)
            torch.cuda.empty_cache()
    payload = {"env": env_info(), "peaks": str(peaks), "rows": rows}
    print(f"-> {write_json('bench_flce_strategies.json', payload)}")


if __name__ == "__main__":
    main()
