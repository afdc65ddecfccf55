"""Question: Where does one training step's time go: forward, backward, optimizer, and which kernel kinds?
Answer recorded in docs/design/training-step.md.

Where one training step of bench_e2e's model goes: forward, backward and the optimizer step timed apart
(synchronised, median of steps), AdamW foreach vs fused on the same parameters, and the GPU kernels of one
step grouped by kind (profiler). One method per process (liger-kernel patches classes for good).

Usage: python -m benchmarks.probes.e2e_step --method ours|ours_compile|hf_compile|liger [--model llama] [--layers 2] [--tokens 8192]
       python -m benchmarks.probes.e2e_step --method ours --step-model llama3_2_1b [--shape 2x4096]   (bench_step's
       real configs at bench_step's depth: the per-step profile)
       --memory: also the tensors alive at the step's peak (allocator history of one step), grouped by the line
       that allocated them
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks import e2e as bench_e2e
from benchmarks.harness import write_probe

KINDS = (
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
    ("attention", ("flash", "fmha", "attention")),
    ("optimizer", ("foreach", "multi_tensor", "adam")),
    ("embedding", ("embedding", "index", "scatter", "sort", "radix")),
    ("triton", ("triton", "_kernel")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def trace_summary(trace_path: str, top: int = 15) -> dict:
    """The GPU timeline of a chrome trace: span, busy and idle ms, the longest idle gaps with the kernels on either
    side, GPU ms per kernel kind and per kernel name (kernels only: no CPU op counted twice), and the host time
    before the first kernel (``lead_ms``) and after the last one (``tail_ms``), which a GPU span leaves out."""
    import json

    events = [e for e in json.load(open(trace_path)).get("traceEvents", []) if e.get("ph") == "X"]
    spans = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0), e.get("name", ""))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    if not spans:
        return {"idle_ms": None}
    host = [
        (e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in ("cpu_op", "user_annotation")
    ]
    gaps, busy, end, prev = [], 0.0, spans[0][0], spans[0][2]
    kinds: dict[str, float] = defaultdict(float)
    names: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for s, e, name in spans:
        if s > end:
            gaps.append(((s - end) / 1e3, prev[:70], name[:70], end, s))
        busy += max(0.0, e - max(s, end))
        if e > end:
            end, prev = e, name
        kinds[kind_of(name)] += (e - s) / 1e3
        names[name[:110]][0] += (e - s) / 1e3
        names[name[:110]][1] += 1
    gaps.sort(reverse=True)
    return {
        "span_ms": (end - spans[0][0]) / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": sum(g[0] for g in gaps),
        "gaps_over_50us": sum(1 for g in gaps if g[0] > 0.05),
        "lead_ms": (spans[0][0] - min(h[0] for h in host)) / 1e3 if host else None,
        "tail_ms": (max(h[1] for h in host) - end) / 1e3 if host else None,
        "kinds_ms": dict(kinds),
        "kernels": sorted(((ms, n, k) for k, (ms, n) in names.items()), reverse=True)[:40],
        "longest": [(round(g[0], 3), g[1], g[2], host_during(events, g[3], g[4])) for g in gaps[:top]],
    }


def host_during(events: list, start: float, end: float, top: int = 14) -> list:
    """The host ops (outermost first, longest first) that ran while the GPU sat idle from ``start`` to ``end``."""
    ops = [
        (min(e["ts"] + e.get("dur", 0), end) - max(e["ts"], start), e.get("name", "")[-90:])
        for e in events
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function")
        and e["ts"] < end
        and e["ts"] + e.get("dur", 0) > start
    ]
    return [f"{name} {us / 1e3:.2f}" for us, name in sorted(ops, reverse=True)[:top]]


OWN_CODE = ("liger_registry", "liger_kernel", "transformers", "torch/optim", "benchmarks")


def _where(frames: list) -> str:
    """The innermost frame in a library of interest (else the innermost frame) as file:line function."""
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in OWN_CODE) and "torch/utils" not in name:
            tail = "/".join(name.split("/")[-2:])
            return f"{tail}:{f.get('line')} {f.get('name')}"
    return "(no python frame: autograd engine / C++)" if not frames else f"{frames[0].get('name')}"


def peak_breakdown(snapshot: dict, top: int = 25) -> dict:
    """The allocations alive at the highest point of one step's allocator trace (those made before recording
    started are not in it: parameters, optimizer state), grouped by the line that made them."""
    events = snapshot["device_traces"][0] if snapshot.get("device_traces") else []
    live, total, peak, at = {}, 0, 0, -1
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])
        if total > peak:
            peak, at = total, i
    live = {}
    for e in events[: at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    groups = defaultdict(lambda: [0, 0])
    for e in live.values():
        g = groups[_where(e.get("frames", []))]
        g[0] += e["size"]
        g[1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {
        "peak_mib_above_start": peak / 2**20,
        "at_event": at,
        "events": len(events),
        "groups": [(k, v[0] / 2**20, v[1]) for k, v in rows[:top]],
    }


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def build(args: argparse.Namespace):
    """The model and its job: bench_e2e's cut (--model, --layers, --tokens, batch 1) or bench_step's config."""
    if args.step_model is None:
        job = dict(model=args.model, layers=args.layers, tokens=args.tokens, method=args.method, batch=1)
        job.update(smoke=False, dtype=torch.bfloat16)
        return bench_e2e.build_model(job, "cuda")[0], job
    from benchmarks import step as bench_step

    name = args.step_model
    batch, seq = bench_step.shape_of(args.shape)
    layers = bench_step.CUT.get(name, bench_step.MODELS[name]["num_hidden_layers"])
    job = dict(model=name, layers=layers, batch=batch, seq=seq, tokens=batch * seq, method=args.method)
    job.update(smoke=False, attn=bench_step.ATTN.get(name, "sdpa"), peer_apply=bench_step.PEER_APPLY[name])
    return bench_step.build_model(job, "cuda", torch.bfloat16)[0], job


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="ours")
    p.add_argument("--model", default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument(
        "--optimizer", choices=("foreach", "fused"), default="fused", help="AdamW of the profiled step"
    )
    p.add_argument("--step-model", default=None, help="a step bench model (its config and depth) instead")
    p.add_argument("--shape", default="2x4096", help="BATCHxSEQ with --step-model")
    p.add_argument(
        "--memory", action="store_true", help="the tensors alive at one step's peak, by allocating line"
    )
    args = p.parse_args()
    model, job = build(args)
    info = bench_e2e.patch(job, model)
    step_model = torch.compile(model) if args.method.endswith(bench_e2e.COMPILED) else model
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (job["batch"], job["tokens"] // job["batch"]), device="cuda")
    opts = {
        "foreach": torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True),
        "fused": torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True),
    }
    phases = defaultdict(list)
    holder = {}

    def fwd():
        holder["loss"] = step_model(input_ids=ids, labels=ids).loss

    for _ in range(args.steps):
        phases["forward"].append(timed(fwd))
        phases["backward"].append(timed(lambda: holder.pop("loss").backward()))
        for name, opt in opts.items():
            phases[f"adamw_{name}"].append(timed(opt.step))
        model.zero_grad(set_to_none=True)
    med = {k: statistics.median(v[2:]) for k, v in phases.items()}
    from torch.profiler import ProfilerActivity, profile

    opt = opts[args.optimizer]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        fwd()
        holder.pop("loss").backward()
        opt.step()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    memory = {}
    if args.memory:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
        fwd()
        holder.pop("loss").backward()
        opt.step()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        memory = peak_breakdown(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
        memory["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        memory["start_gib"] = start / 2**30
    trace = str(Path(tempfile.mkdtemp()) / "trace.json")
    prof.export_chrome_trace(trace)
    gaps = trace_summary(trace)
    import transformers

    print(
        f"{args.method} {job['model']} L{job['layers']} {job['tokens']} tokens  {info.get('flce_plan', '')}"
        f"  ({torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__})"
    )
    print("phase ms (median): " + " ".join(f"{k} {v:.2f}" for k, v in med.items()))
    kinds = gaps.get("kinds_ms", {})
    print("GPU kernel ms of one step by kind: " + " ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items())))
    print(
        f"GPU timeline of one step (adamw {args.optimizer}): span {gaps.get('span_ms', 0):.2f} ms, busy "
        f"{gaps.get('busy_ms', 0):.2f}, idle {gaps.get('idle_ms', 0):.2f} ({gaps.get('gaps_over_50us')} gaps > 50 us); "
        f"host before the first kernel {gaps.get('lead_ms') or 0:.2f} ms, after the last {gaps.get('tail_ms') or 0:.2f}"
    )
    for ms, before, after, host in gaps.get("longest", []):
        print(f"  idle {ms:7.3f} ms after {before!r} before {after!r}\n      host: {'; '.join(host)}")
    if step_model is not model:
        from torch._dynamo.utils import counters

        print(
            "dynamo: "
            + "; ".join(
                f"{k} {dict(v)}" for k, v in counters.items() if k in ("frames", "graph_break", "stats")
            )
        )
    for ms, count, key in gaps.get("kernels", [])[:40]:
        print(f"  {ms:8.2f} ms {count:5d}x  {key}")
    if memory:
        print(
            f"memory: max allocated {memory['max_allocated_gib']:.3f} GiB, {memory['start_gib']:.3f} before the step;"
            f" the step's peak {memory['peak_mib_above_start']:.1f} MiB above that (event {memory['at_event']} of"
            f" {memory['events']}); alive there, by allocating line:"
        )
        for where, mib, count in memory["groups"]:
            print(f"  {mib:9.1f} MiB {count:5d}x  {where}")
    write_probe(
        "e2e_step",
        {"args": vars(args), "phases_ms": med, "timeline": gaps, "memory": memory, **info},
        tag=args.method + (f"-{args.step_model}" if args.step_model else ""),
    )


if __name__ == "__main__":
    main()
