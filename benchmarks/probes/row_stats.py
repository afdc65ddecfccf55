"""Question: Which statistics pass (per-lane state or block reductions) and column block should the row kernels use?
Answer recorded in docs/design/ce-row-stats.md.

Which statistics pass (per-lane state or block reductions) and column block the row kernels should use:
each configuration of ``triton_row_stats.ROW_STATS`` timed alone (median of the harness) on the shapes that matter.

Cases: the CE op's rows kernel on 4096 x 128256 (loss + in-place gradient), the FLCE token chunk of GPT-OSS
throughput (1280 x 201088), the vocabulary strategy's statistics kernel on Llama's pass-1 chunk at 8192 tokens
(8192 x 42752) and GPT-OSS's at 2048 tokens (2048 x 117504). JSON under $OUT (else benchmarks/results/).

``--warps 8,16,32`` times each configuration at each warp count instead of the launchers' rule
(``triton_utils.warps_for``); ``--cases ce_rows`` keeps the cases whose name starts with it; ``--rows 4096,16384``
the CE op's row counts (128256 columns); ``--grad-out`` writes the gradient to a new buffer, as the CE op does by
default (bytes: the logits read twice and the gradient written once either way); ``--grad-reversed`` times each
configuration with the CE rows kernel's gradient pass in both column orders (``GRAD_REVERSED`` off, then on);
``--configs blocks8192,blocks32768`` keeps those statistics passes.

Usage: python -m benchmarks.probes.row_stats [--warps 8,16,32] [--cases ce_rows] [--rows 4096,16384] [--grad-out]
       [--grad-reversed] [--configs blocks8192,blocks32768]
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch

from benchmarks.harness import median_ms, write_probe
from liger_registry.kernels import triton_utils
from liger_registry.kernels.ce import triton_kernels as triton_row_stats
from liger_registry.kernels.ce.triton_kernels import ce_rows_triton, row_scales
from liger_registry.kernels.flce import triton_kernels as tv
from liger_registry.kernels.flce.options import FlceOptions
from liger_registry.kernels.flce.reference import new_state

CONFIGS = [
    ("lanes", 2048),
    ("lanes", 4096),
    ("lanes", 8192),
    ("blocks", 8192),
    ("blocks", 16384),
    ("blocks", 32768),
]
ROWS_CASES = [(4096, 128256), (1280, 201088)]
STATS_CASES = [(8192, 42752), (2048, 117504)]


def ce_rows_call(buf: torch.Tensor, target: torch.Tensor, grad_out: torch.Tensor | None = None):
    """One launch of the CE rows kernel on ``buf`` (loss + gradient, in place unless ``grad_out``, plain
    options), as a callable."""
    n = buf.shape[0]
    ce = torch.empty(n, dtype=torch.float32, device=buf.device)
    scale = torch.tensor(1.0 / n, device=buf.device)
    extra = row_scales("triton", scale, scale, None, buf.device)
    kw = dict(ignore_index=-100, label_smoothing=0.0, softcap=None, logit_scale=1.0, lse_square_scale=0.0)
    kw.update(class_weights=None, ce_grad_scale=scale, z_grad_scale=scale, row_grad=None, compute_grad=True)
    return lambda: ce_rows_triton(
        buf, target, **kw, argmax_mode=0, out=(ce, None, None), target_logit=None, grad_out=grad_out, **extra
    )


def rows_fn(n: int, v: int, grad_out: bool = False):
    buf = torch.randn(n, v, device="cuda").bfloat16()
    g = torch.empty_like(buf) if grad_out else None
    return ce_rows_call(buf, torch.randint(0, v, (n,), device="cuda"), g)


def stats_fn(n: int, w: int):
    buf = torch.randn(n, w, device="cuda").bfloat16()
    t = torch.randint(0, w, (n,), device="cuda")
    state, opts = new_state(n, buf.device), FlceOptions()
    return lambda: tv.stats_update_triton(buf, 0, t, state, opts=opts, class_weights=None, argmax=False)


@contextmanager
def launched(count: int | None, reversed_: bool | None):
    """The row kernels launched with ``count`` warps and the CE gradient pass in the order ``reversed_`` (None:
    the launchers' own rule, the module's order)."""
    rule, order = triton_utils.warps_for, triton_row_stats.GRAD_REVERSED
    if count is not None:
        triton_utils.warps_for = lambda block: count
    if reversed_ is not None:
        triton_row_stats.GRAD_REVERSED = reversed_
    try:
        yield
    finally:
        triton_utils.warps_for, triton_row_stats.GRAD_REVERSED = rule, order


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", default="", help="comma list of warp counts (default: the launchers' rule)")
    ap.add_argument("--cases", default="", help="keep the cases whose name starts with this")
    ap.add_argument("--rows", default="", help="comma list of the CE op's row counts (128256 columns)")
    ap.add_argument(
        "--grad-out", action="store_true", help="the gradient into a new buffer (the CE op's default)"
    )
    ap.add_argument("--grad-reversed", action="store_true", help="each config in both gradient-pass orders")
    ap.add_argument(
        "--configs", default="", help="comma list of statistics passes, e.g. blocks8192,lanes2048"
    )
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    rows_cases = [(int(n), 128256) for n in args.rows.split(",")] if args.rows else ROWS_CASES
    # bytes: the logits read twice (statistics, gradient) and the gradient written once
    cases = {
        f"ce_rows {n}x{v}": ("ce_rows", rows_fn(n, v, args.grad_out), 3 * n * v * 2) for n, v in rows_cases
    }
    cases.update({f"vocab_stats {n}x{w}": ("vocab_stats", stats_fn(n, w), n * w * 2) for n, w in STATS_CASES})
    cases = {k: c for k, c in cases.items() if k.startswith(args.cases)}
    counts = [int(w) for w in args.warps.split(",")] if args.warps else [None]
    orders = [False, True] if args.grad_reversed else [None]
    kept = set(args.configs.split(",")) if args.configs else {f"{m}{c}" for m, c in CONFIGS}
    configs = [(m, c, w, r) for m, c in CONFIGS if f"{m}{c}" in kept for w in counts for r in orders]
    default = dict(triton_row_stats.ROW_STATS)
    res = {}
    for name, (kernel, fn, nbytes) in cases.items():
        res[name] = {}
        for mode, cap, w, r in configs:
            triton_row_stats.ROW_STATS[kernel] = (mode, cap)
            tv._flags.cache_clear()
            with launched(w, r):
                ms = median_ms(fn)
            res[name][label(mode, cap, w, r)] = {"ms": ms, "tbs": nbytes / ms / 1e9}
        triton_row_stats.ROW_STATS.update(default)
        tv._flags.cache_clear()
    width = max(len(k) for k in res)
    print(f"{'case (ms, TB/s)':<{width}} " + " ".join(label(*c).rjust(15) for c in configs))
    for name, row in res.items():
        cells = " ".join(f"{r['ms']:7.3f} {r['tbs']:5.2f}".rjust(15) for r in row.values())
        print(f"{name:<{width}} {cells}")
    write_probe(
        "row_stats", {"configs": configs, "results": res, "default": default, "grad_out": args.grad_out}
    )


def label(mode: str, cap: int, w: int | None, r: bool | None = None) -> str:
    return f"{mode}{cap}" + ("" if w is None else f"w{w}") + ("" if not r else "r")


if __name__ == "__main__":
    main()
