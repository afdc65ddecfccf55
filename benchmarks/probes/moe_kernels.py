"""Question: Do our grouped-GEMM experts match transformers' grouped_mm experts, and how fast are they?
Answer recorded in docs/design/moe-experts.md.

Our grouped-GEMM experts against transformers' grouped_mm experts on three shapes, bf16,
fwd+bwd: max |diff| of output and gradients (relative to the reference's max) and median ms. GPU only.

Usage: python -m benchmarks.probes.moe_kernels [--tokens 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from liger_registry.kernels.moe import moe_experts
from liger_registry.kernels.moe import ops as moe_ops

SHAPES = {  # experts, top-k, hidden, intermediate, act, transposed+bias
    "qwen3_30b_a3b": (128, 8, 2048, 768, "swiglu", False),
    "mixtral_8x7b": (8, 2, 4096, 14336, "swiglu", False),
    "gpt_oss_20b": (32, 4, 2880, 2880, "clamped_swiglu", True),
}


def reference(x, idx, w, wgu, wd, bgu, bd, act, transposed):
    from transformers.integrations.moe import _grouped_linear

    s = idx.numel()
    k = idx.shape[1]
    ids = idx.reshape(-1)
    ids_g, perm = torch.sort(ids)
    xg = x[perm // k]
    counts = torch.histc(ids_g.int(), bins=wgu.shape[0], min=0, max=wgu.shape[0] - 1)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    gu = _grouped_linear(xg, wgu, offs, bias=None if bgu is None else bgu[ids_g], is_transposed=transposed)
    if act == "clamped_swiglu":
        g, u = gu[..., ::2].clamp(max=7.0), gu[..., 1::2].clamp(-7.0, 7.0)
        h = (u + 1) * (g * torch.sigmoid(g * 1.702))
    else:
        g, u = gu.chunk(2, -1)
        h = torch.nn.functional.silu(g) * u
    y = _grouped_linear(h, wd, offs, bias=None if bd is None else bd[ids_g], is_transposed=transposed)
    y = y * w.reshape(-1)[perm].unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(s, device=x.device)
    return y[inv].view(-1, k, x.shape[1]).sum(1).to(x.dtype)


def timed(fn, iters=10):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _inputs(e, k, hid, inter, tr, t, dev="cuda"):
    torch.manual_seed(0)
    x = torch.randn(t, hid, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w, idx = torch.softmax(torch.randn(t, e, device=dev), -1).topk(k, -1)
    w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16).requires_grad_()
    gu_shape, d_shape = (
        ((e, hid, 2 * inter), (e, inter, hid)) if tr else ((e, 2 * inter, hid), (e, hid, inter))
    )
    wgu = (torch.randn(gu_shape, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
    wd = (torch.randn(d_shape, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
    bgu = (
        (torch.randn(e, 2 * inter, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_() if tr else None
    )
    bd = (torch.randn(e, hid, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_() if tr else None
    return x, idx, w, wgu, wd, bgu, bd


def _rel(outs, refs) -> list[str]:
    return [
        f"{((a.float() - b.float()).abs().max() / b.float().abs().max()).item():.1e}"
        for a, b in zip(outs, refs, strict=True)
    ]


def run_case(
    name: str, e, k, hid, inter, act, tr, t, breakdown: bool = False, wgrad_ab: bool = False
) -> None:
    x, idx, w, wgu, wd, bgu, bd = _inputs(e, k, hid, inter, tr, t)
    params = [p for p in (x, w, wgu, wd, bgu, bd) if p is not None]
    dy = torch.randn(t, hid, device="cuda", dtype=torch.bfloat16)
    kw = dict(act=act, limit=7.0, alpha=1.702, transposed=tr)
    methods = {
        "ours": lambda: moe_experts(x, idx, w, wgu, wd, bgu, bd, **kw),
        "grouped_mm": lambda: reference(x, idx, w, wgu, wd, bgu, bd, act, tr),
    }
    if wgrad_ab:
        methods["ours_other_wgrad"] = methods.pop("ours")
    results = {m: (fn(), torch.autograd.grad(fn(), params, dy)) for m, fn in methods.items()}
    p32 = [p.detach().float().requires_grad_() for p in params]
    biases = (p32[4], p32[5]) if tr else (None, None)
    os.environ["LIGER_REGISTRY_BACKEND"] = "torch"
    o32 = moe_experts(*p32[:1], idx, *p32[1:4], *biases, **kw)
    g32 = torch.autograd.grad(o32, p32, dy.float())
    del os.environ["LIGER_REGISTRY_BACKEND"]
    print(f"{name} T={t}: (out, d x, d w, d w_gu, d w_d[, d b_gu, d b_d]) relative to fp32")
    for m, (out, grads) in results.items():
        print(f"   {m:10s} {_rel((out, *grads), (o32, *g32))}")
    ms = {}
    for m, fn in methods.items():
        ms[m + "_fwd"] = timed(fn)
        ms[m] = timed(lambda fn=fn: torch.autograd.grad(fn(), params, dy))
    ours = next(m for m in ms if m.startswith("ours") and not m.endswith("_fwd"))
    flops = 3 * 2 * t * k * (hid * 2 * inter + inter * hid)
    print(
        "   "
        + "  ".join(f"{label} {v:.2f} ms" for label, v in ms.items())
        + f"  {ours} {flops / ms[ours] / 1e9:.0f} TFLOP/s  speedup {ms['grouped_mm'] / ms[ours]:.2f}x"
    )
    if breakdown:
        for m, fn in methods.items():
            print(
                f"   {m} fwd+bwd by kernel: "
                + kernel_times(lambda fn=fn: torch.autograd.grad(fn(), params, dy))
            )


def kernel_times(step, top: int = 8) -> str:
    """GPU time per kernel name over one step (after the timed runs: autotuning done), the largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            totals[ev.name[:40]] = totals.get(ev.name[:40], 0.0) + ev.time_range.elapsed_us() / 1e3
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    rest = sum(v for _, v in ranked[top:])
    return ", ".join(f"{n} {v:.2f}" for n, v in ranked[:top]) + f", rest {rest:.2f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument(
        "--wgrad-ab",
        action="store_true",
        help="again with the other weight-gradient GEMMs (grouped_mm / Triton)",
    )
    ap.add_argument("--breakdown", action="store_true", help="GPU time per kernel of one fwd+bwd (profiler)")
    args = ap.parse_args()
    for name in args.shapes.split(","):
        for t in map(int, args.tokens.split(",")):
            run_case(name, *SHAPES[name], t, args.breakdown)
            if args.wgrad_ab:  # again with the other weight-gradient GEMMs
                chosen = moe_ops.wgrad_by_grouped_mm
                moe_ops.wgrad_by_grouped_mm = lambda x, h, chosen=chosen: not chosen(x, h)
                run_case(name, *SHAPES[name], t, args.breakdown, wgrad_ab=True)
                moe_ops.wgrad_by_grouped_mm = chosen


if __name__ == "__main__":
    main()
