"""Print the FLCE planner's choice and predicted ms for the ANCHORS.md shapes (no GPU needed).

PYTHONPATH=. python benchmarks/flce_plan_table.py [--gpu "NVIDIA H200"]
"""

from __future__ import annotations

import argparse

import torch

from liger_registry.kernels import flce_plan
from liger_registry.kernels.flce.cost import peaks_for, tokens_ms, vocab_ms

SHAPES = {"Llama-3 H=4096 V=128256": (4096, 128256), "GPT-OSS H=2880 V=201088": (2880, 201088)}
BUDGETS = {"C=1": {"chunk_mem_const": 1}, "C=8": {"chunk_mem_const": 8}, "512 MiB": {"max_chunk_mib": 512}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="NVIDIA H200")
    args = parser.parse_args()
    peaks = peaks_for(args.gpu)
    print(f"peaks: {peaks}")
    print(f"{'shape':<25} {'BT':>6} {'budget':>8} {'tokens ms':>10} {'vocab ms':>9} {'pick':>7}  plan")
    for name, (h, v) in SHAPES.items():
        for bt in (2048, 4096, 8192, 16384):
            for label, knobs in BUDGETS.items():
                plan = flce_plan(bt, h, v, gpu=args.gpu, **knobs)
                t = flce_plan(bt, h, v, gpu=args.gpu, strategy="tokens", **knobs)
                voc = flce_plan(bt, h, v, gpu=args.gpu, strategy="vocab", **knobs)
                t_ms = tokens_ms(bt, h, v, t.chunk_tokens, 2, peaks)
                v_ms = (
                    vocab_ms(bt, h, v, voc.chunk_vocab, 2, peaks) if voc.strategy == "vocab" else float("nan")
                )
                print(
                    f"{name:<25} {bt:>6} {label:>8} {t_ms:>10.1f} {v_ms:>9.1f} {plan.strategy:>7}  "
                    f"{plan.num_chunks} x [{plan.chunk_tokens}, {plan.chunk_vocab}] {plan.buffer_mib:.0f} MiB"
                )


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
