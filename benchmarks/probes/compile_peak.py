"""Question: Where do a compiled training step's peak memory and time go, phase by phase?
Answer recorded in docs/design/compile.md.

Where a compiled training step's peak memory and time go: one bench_e2e model and method, eager or compiled,
with the peak of each phase (forward, backward, optimizer), the memory the forward leaves for the backward, and
the largest blocks alive at the step's peak with the frames that allocated them (CUDA allocator history).
One method per process.

Usage: python -m benchmarks.probes.compile_peak --method ours [--compile] [--model llama] [--layers 2] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks import e2e as bench_e2e

GIB = 2**30


def frame_label(frames: list[dict]) -> str:
    """The innermost frames worth naming: ours, inductor's output code, transformers, autograd."""
    keep = ("liger_registry", "torchinductor", "/tmp/", "transformers/", "autograd", "_functorch")
    picked = [
        f"{Path(f['filename']).name}:{f['line']}:{f['name']}"
        for f in frames
        if any(k in f["filename"] for k in keep)
    ]
    return " < ".join(picked[:4]) or (frames[0]["name"] if frames else "?")


def blocks_at_peak(snapshot: dict, top: int = 12) -> tuple[float, list]:
    """Replay the allocator trace; the blocks alive when the sum of live allocations peaked."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snapshot["device_traces"]:
        for ev in trace:
            if ev["action"] == "alloc":
                live[ev["addr"]] = (ev["size"], frame_label(ev.get("frames", [])))
                total += ev["size"]
                if total > peak:
                    peak, at_peak = total, dict(live)
            elif ev["action"] in ("free_requested", "free_completed") and ev["addr"] in live:
                total -= live.pop(ev["addr"])[0]
    biggest = sorted(at_peak.values(), reverse=True)[:top]
    return peak / GIB, [(round(s / GIB, 3), label) for s, label in biggest]


def head_only(args) -> None:
    """The FLCE head alone at the model's shape (no decoder): eager and compiled, ms and peak above the inputs."""
    from liger_registry.kernels import fused_linear_cross_entropy

    cfg = bench_e2e.MODELS[args.model]
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hidden = torch.randn(args.tokens, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    target = torch.randint(0, v, (args.tokens,), device="cuda")

    def step(fn):
        loss = fn(hidden, weight, target)
        loss = loss.loss if hasattr(loss, "loss") else loss
        loss.backward()
        hidden.grad = weight.grad = None

    for name, fn in (
        ("eager", fused_linear_cross_entropy),
        ("compiled", torch.compile(fused_linear_cross_entropy)),
    ):
        times = []
        for _ in range(6):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            step(fn)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        extra = (torch.cuda.max_memory_allocated() - base) / GIB
        print(
            f"== head {args.model} T{args.tokens} {name}: {statistics.median(times[2:]):.2f} ms, peak above inputs {extra:.2f} GiB"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="ours")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--model", default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--head", action="store_true", help="the FLCE head alone, eager and compiled")
    args = p.parse_args()
    if args.head:
        return head_only(args)
    job = dict(
        model=args.model,
        layers=args.layers,
        tokens=args.tokens,
        method=args.method,
        smoke=False,
        dtype=torch.bfloat16,
        batch=1,
    )
    model, _ = bench_e2e.build_model(job, "cuda")
    bench_e2e.patch(job, model)
    step_model = torch.compile(model) if args.compile else model
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    phases: dict[str, list] = {"forward": [], "backward": [], "optimizer": []}
    peaks: dict[str, float] = {}
    kept = 0.0

    def phase(name, fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        phases[name].append((time.perf_counter() - t0) * 1e3)
        peaks[name] = torch.cuda.max_memory_allocated() / GIB
        return out

    for step in range(args.steps):
        if step == args.steps - 1:
            torch.cuda.memory._record_memory_history(max_entries=200000)
        base = torch.cuda.memory_allocated() / GIB
        loss = phase("forward", lambda: step_model(input_ids=ids, labels=ids).loss)
        kept = torch.cuda.memory_allocated() / GIB - base
        phase("backward", loss.backward)
        phase("optimizer", opt.step)
        opt.zero_grad(set_to_none=True)
        del loss
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, biggest = blocks_at_peak(snapshot)
    name = args.method + ("_compile" if args.compile else "")
    med = {k: statistics.median(v[3:-1]) for k, v in phases.items()}
    print(f"== {name} {args.model} L{args.layers} T{args.tokens}")
    print(
        "  ms (median): "
        + "  ".join(f"{k} {v:.2f}" for k, v in med.items())
        + f"  step {sum(med.values()):.2f}"
    )
    print("  peak GiB by phase: " + "  ".join(f"{k} {v:.2f}" for k, v in peaks.items()))
    print(
        f"  forward keeps {kept:.2f} GiB for the backward; live-allocation peak of the last step {peak:.2f} GiB"
    )
    for size, label in biggest:
        print(f"    {size:6.3f} GiB  {label[:200]}")


if __name__ == "__main__":
    main()
