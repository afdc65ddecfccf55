"""Question: Which statistics pass (per-lane state or block reductions) and column block should the row kernels use?
Answer recorded in docs/design/ce-row-stats.md.

Which statistics pass (per-lane state or block reductions) and column block the row kernels should use:
each configuration of ``triton_row_stats.ROW_STATS`` timed alone (median of the harness) on the shapes that matter.

Cases: the CE op's rows kernel on 4096 x 128256 (loss + in-place gradient), the FLCE token chunk of GPT-OSS
throughput (1280 x 201088), the vocabulary strategy's statistics kernel on Llama's pass-1 chunk at 8192 tokens
(8192 x 42752) and GPT-OSS's at 2048 tokens (2048 x 117504). JSON under $OUT (else benchmarks/results/).

Usage: python -m benchmarks.probes.row_stats
"""

from __future__ import annotations

import torch

from benchmarks.harness import median_ms, write_probe
from liger_registry.kernels.ce import triton_row_stats
from liger_registry.kernels.ce.triton_rows import ce_rows_triton, row_scales
from liger_registry.kernels.flce import triton_vocab as tv
from liger_registry.kernels.flce.options import FlceOptions
from liger_registry.kernels.flce.vocab_rows import new_state

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


def ce_rows_call(buf: torch.Tensor, target: torch.Tensor):
    """One launch of the CE rows kernel on ``buf`` (loss + in-place gradient, plain options), as a callable."""
    n = buf.shape[0]
    ce = torch.empty(n, dtype=torch.float32, device=buf.device)
    scale = torch.tensor(1.0 / n, device=buf.device)
    extra = row_scales("triton", scale, scale, None, buf.device)
    kw = dict(ignore_index=-100, label_smoothing=0.0, softcap=None, logit_scale=1.0, lse_square_scale=0.0)
    kw.update(class_weights=None, ce_grad_scale=scale, z_grad_scale=scale, row_grad=None, compute_grad=True)
    return lambda: ce_rows_triton(
        buf, target, **kw, argmax_mode=0, out=(ce, None, None), target_logit=None, **extra
    )


def rows_fn(n: int, v: int):
    buf = torch.randn(n, v, device="cuda").bfloat16()
    return ce_rows_call(buf, torch.randint(0, v, (n,), device="cuda"))


def stats_fn(n: int, w: int):
    buf = torch.randn(n, w, device="cuda").bfloat16()
    t = torch.randint(0, w, (n,), device="cuda")
    state, opts = new_state(n, buf.device), FlceOptions()
    return lambda: tv.stats_update_triton(buf, 0, t, state, opts=opts, class_weights=None, argmax=False)


def main() -> None:
    cases = {f"ce_rows {n}x{v}": ("ce_rows", rows_fn(n, v), 3 * n * v * 2) for n, v in ROWS_CASES}
    cases.update({f"vocab_stats {n}x{w}": ("vocab_stats", stats_fn(n, w), n * w * 2) for n, w in STATS_CASES})
    default = dict(triton_row_stats.ROW_STATS)
    res = {}
    for name, (kernel, fn, nbytes) in cases.items():
        res[name] = {}
        for mode, cap in CONFIGS:
            triton_row_stats.ROW_STATS[kernel] = (mode, cap)
            tv._flags.cache_clear()
            ms = median_ms(fn)
            res[name][f"{mode}{cap}"] = {"ms": ms, "tbs": nbytes / ms / 1e9}
        triton_row_stats.ROW_STATS.update(default)
        tv._flags.cache_clear()
    width = max(len(k) for k in res)
    print(f"{'case (ms, TB/s)':<{width}} " + " ".join(f"{m}{c:>6}".rjust(15) for m, c in CONFIGS))
    for name, row in res.items():
        cells = " ".join(f"{r['ms']:7.3f} {r['tbs']:5.2f}".rjust(15) for r in row.values())
        print(f"{name:<{width}} {cells}")
    write_probe("row_stats", {"configs": CONFIGS, "results": res, "default": default})


if __name__ == "__main__":
    main()
