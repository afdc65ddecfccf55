"""Llama 4's MoE block (GPU): transformers' Llama4TextMoe, which runs every expert on every token (inputs scaled by
the dense sigmoid router scores, zero where an expert is not selected), against the same module with the llama4
registry entry's moe_experts forward (only the top-k selected experts, on the grouped-GEMM kernel).

Shapes: Llama-4-Scout-17B-16E (16 experts, top-1, hidden 5120, expert intermediate 8192, shared expert 8192) at
--tokens; bf16, weights ~ N(0, 0.02^2), hidden states ~ N(0, 1), fixed seeds. Per method: median ms of forward +
backward (gradients of the hidden states and every parameter: router, experts, shared expert), incremental peak
MiB, and the largest relative difference (max|x - ref| / max|ref| over the output and every gradient) against
transformers' block in bf16. JSON under $OUT (or benchmarks/results/).

Usage: python benchmarks/bench_llama4_moe.py [--tokens 4096,16384] [--experts 16] [--top-k 1]
       python benchmarks/bench_llama4_moe.py --cpu-smoke    # tiny dims, fp32, CPU: checks the script
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from common import env_info, incremental_peak_mib, median_ms, out_dir
from transformers.models.llama4 import modeling_llama4
from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

from liger_registry.modules.moe import moe_experts_forward
from liger_registry.registry import load_registry


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--cpu-smoke", action="store_true")
    return p.parse_args()


def _block(args, device, dtype) -> torch.nn.Module:
    dims = (32, 24) if args.cpu_smoke else (5120, 8192)
    config = Llama4TextConfig(
        hidden_size=dims[0],
        intermediate_size=dims[1],
        intermediate_size_mlp=dims[1],
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
    )
    block = modeling_llama4.Llama4TextMoe(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return block.to(device, dtype)


def _step(forward, block, x):
    def run():
        out, _ = forward(x)
        out.backward(torch.ones_like(out))

    return run


def _grads(forward, block, x) -> list[torch.Tensor]:
    for t in (x, *block.parameters()):
        t.grad = None
    _step(forward, block, x)()
    out, _ = forward(x)
    return [out.detach(), *(t.grad.clone() for t in (x, *block.parameters()))]


def _rel(got: list, want: list) -> float:
    return max(
        ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
        for a, b in zip(got, want, strict=True)
    )


def main() -> int:
    args = _args()
    device, dtype = ("cpu", torch.float32) if args.cpu_smoke else ("cuda", torch.bfloat16)
    block = _block(args, device, dtype)
    spec = load_registry().families["llama4_text"].entry.kernels.moe_experts
    ours = moe_experts_forward(spec).__get__(block)
    methods = {"hf": block.forward, "ours": ours}
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        tokens = 16 if args.cpu_smoke else tokens
        x = torch.randn(
            1, tokens, block.hidden_dim, device=device, dtype=dtype, generator=None
        ).requires_grad_()
        params = [x, *block.parameters()]
        ref = _grads(methods["hf"], block, x)
        for name, forward in methods.items():
            step = _step(forward, block, x)
            if device == "cuda":
                ms = median_ms(step, grad_to_none=params, warmup=25, rep=200)
                peak = incremental_peak_mib(step, clear=params)
            else:
                start = time.perf_counter()
                step()
                ms, peak = (time.perf_counter() - start) * 1e3, float("nan")
            rel = _rel(_grads(forward, block, x), ref)
            rows.append({"tokens": tokens, "method": name, "ms": ms, "peak_mib": peak, "rel_diff": rel})
            print(
                f"  T={tokens:6d} {name:5s} {ms:9.3f} ms  peak {peak:8.0f} MiB  rel diff {rel:.1e}",
                flush=True,
            )
        if args.cpu_smoke:
            break
    by = {(r["tokens"], r["method"]): r for r in rows}
    print(f"\nLlama4TextMoe fwd+bwd, {dtype}, E={args.experts} top-{args.top_k}, hidden {block.hidden_dim}")
    for tokens in sorted({r["tokens"] for r in rows}):
        hf, o = by[(tokens, "hf")], by[(tokens, "ours")]
        print(
            f"  T={tokens:6d}: hf {hf['ms']:.2f} ms, ours {o['ms']:.2f} ms: {hf['ms'] / o['ms']:.2f}x; peak MiB hf "
            f"{hf['peak_mib']:.0f}, ours {o['peak_mib']:.0f}; rel diff {o['rel_diff']:.1e}"
        )
    path = out_dir() / ("bench_llama4_moe_smoke.json" if args.cpu_smoke else "bench_llama4_moe.json")
    path.write_text(json.dumps({"env": env_info(), "args": vars(args), "rows": rows}, indent=1))
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
