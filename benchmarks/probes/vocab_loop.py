"""Question: Where does the FLCE vocabulary loop's time go on the GPU: wall, host issue, kernels, graph replay?
Answer recorded in docs/design/flce-layouts.md.

Where the FLCE vocabulary loop's time goes on the GPU: wall (median of the harness, 3 repeats), host issue time
(the call queued behind a GPU sleep), GPU kernel time (profiler), and a CUDA-graph replay of the same step (the
time with no host overhead at all). Shapes: the 2-4k token rows where vocab lagged. JSON under $OUT (else benchmarks/results/).

Usage: python -m benchmarks.probes.vocab_loop [--cases gpt_oss:2048,llama:2048,llama:4096]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from benchmarks.harness import kernel_ms, median_ms, write_probe
from liger_registry import kernels as K

SHAPES = {"llama": (4096, 128256), "gpt_oss": (2880, 201088)}


def host_issue_ms(fn, grads) -> float:
    """Host time to queue one step while the GPU is busy (a long sleep ahead of it): no waiting on the GPU."""
    best = float("inf")
    for _ in range(5):
        for t in grads:
            t.grad = None
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time ahead of the step
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return best


def graph_ms(fn, grads) -> float:
    """Median ms of replaying the step captured in a CUDA graph (grads accumulate in place: zero them first)."""
    for t in grads:
        t.grad = None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay)


def launch_us() -> dict:
    """Host microseconds per launch (queued behind a GPU sleep): the vocab loop's row kernel and a cuBLAS GEMM."""
    from liger_registry.kernels.flce.options import FlceOptions
    from liger_registry.kernels.flce.reference import new_state
    from liger_registry.kernels.flce.triton_kernels import stats_update_triton

    n, width = 256, 1024
    buf = torch.randn(n, width, device="cuda").bfloat16()
    a = torch.randn(n, 256, device="cuda").bfloat16()
    b = torch.randn(width, 256, device="cuda").bfloat16()
    target = torch.randint(0, width, (n,), device="cuda")
    state = new_state(n, buf.device)
    opts = FlceOptions()
    calls = {
        "stats_kernel": lambda: stats_update_triton(
            buf, 0, target, state, opts=opts, class_weights=None, argmax=False
        ),
        "mm_out": lambda: torch.mm(a, b.t(), out=buf),
        "view_slice": lambda: b[0:512],
    }
    out = {}
    for name, fn in calls.items():
        fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(500_000_000)
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        out[name] = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
    print("host us per launch:", out, flush=True)
    return out


def case(shape: str, bt: int) -> dict:
    h, v = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    x = torch.randn(bt, h, device="cuda", generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, v, (bt,), device="cuda", generator=g)
    plan = K.flce_plan(bt, h, v, strategy="vocab")
    row = {"shape": shape, "bt": bt, "plan": str(plan)}

    def unpatched():
        F.cross_entropy((x @ w.t()).float(), t).backward()

    def vocab():
        K.fused_linear_cross_entropy(x, w, t, strategy="vocab").backward()

    def tokens():
        K.fused_linear_cross_entropy(x, w, t, strategy="tokens").backward()

    row["unpatched_ms"] = median_ms(unpatched, grad_to_none=[x, w])
    row["vocab_ms"] = [median_ms(vocab, grad_to_none=[x, w]) for _ in range(3)]
    row["tokens_ms"] = median_ms(tokens, grad_to_none=[x, w])
    row["vocab_host_issue_ms"] = host_issue_ms(vocab, [x, w])
    row["vocab_gpu_kernel_ms"] = kernel_ms(vocab, grads=[x, w], label=f"vocab {shape} {bt}")
    row["unpatched_gpu_kernel_ms"] = kernel_ms(unpatched, grads=[x, w])
    try:
        row["vocab_graph_ms"] = graph_ms(vocab, [x, w])
    except Exception as e:  # noqa: BLE001
        row["vocab_graph_ms"] = repr(e)[:300]
    print(row, flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="gpt_oss:2048,llama:2048,llama:4096,gpt_oss:4096")
    args = p.parse_args()
    launches = launch_us()
    rows = [case(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    print(
        f"{'case':<16}{'unpatched':>10}{'vocab (3 repeats)':>26}{'host issue':>11}{'gpu kern':>9}{'graph':>9}"
    )
    for r in rows:
        reps = " ".join(f"{m:.2f}" for m in r["vocab_ms"])
        gms = r["vocab_graph_ms"]
        gtxt = f"{gms:.2f}" if isinstance(gms, float) else "fail"
        print(
            f"{r['shape'] + ' ' + str(r['bt']):<16}{r['unpatched_ms']:>10.2f}{reps:>26}"
            f"{r['vocab_host_issue_ms']:>11.2f}{r['vocab_gpu_kernel_ms']:>9.2f}{gtxt:>9}"
        )
    write_probe("vocab_loop", {"rows": rows, "host_us_per_launch": launches})


if __name__ == "__main__":
    main()
