"""Memory-bound ops benchmark (GPU): ours vs liger-kernel 0.8.5 vs HF / PyTorch eager, forward + backward, bf16.

Median ms (the harness: warm-up, then the methods of a case interleaved), and achieved bandwidth (the bytes the op must move at least, stated per row
as a formula, / time) against a device-to-device copy measured in the same run: from the wall time (includes
the Python side of the call) and from the GPU kernel time (torch.profiler, the op's own speed). The walls of
every case are taken first and the profiler runs afterwards: Kineto can leave CUPTI attached after a profiler
run (a known torch.profiler behaviour), which slowed the launches of every case timed after the first profiled one.
The peer is imported here only.
Usage: python -m benchmarks ops [--repeats 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import traceback

import torch
import torch.nn.functional as F

from benchmarks import harness
from liger_registry import kernels as K
from liger_registry.kernels.glu.torch_math import geglu_torch, swiglu_torch

BF = torch.bfloat16


def _rand(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(BF).requires_grad_()


def case_rms_norm():
    n, h = 16384, 4096
    x, w = _rand(n, h), _rand(h, scale=0.1)
    dy = torch.randn(n, h, device="cuda").to(BF)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(h, 1e-6).to("cuda", BF)

    def peer():
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True).backward(dy)

    return {
        "name": f"RMSNorm {n}x{h}",
        "bytes": 5 * n * h * 2,
        "bytes_note": "fwd: read x, write y; bwd: read x, dy, write dx (bf16)",
        "grads": [x, w],
        "ours": lambda: K.rms_norm(x, w, 1e-6).backward(dy),
        "ours in-place bwd": lambda: K.rms_norm(x, w, 1e-6, in_place_backward=True).backward(dy),
        "peer": peer,
        "eager": lambda: hf(x).backward(dy),
    }


def _glu_case(kind):
    n, h = 16384, 14336
    a, b = _rand(n, h), _rand(n, h)
    dc = torch.randn(n, h, device="cuda").to(BF)
    ours = K.swiglu if kind == "swiglu" else K.geglu
    eager = swiglu_torch if kind == "swiglu" else geglu_torch

    def peer():
        if kind == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction as Fn
        else:
            from liger_kernel.ops.geglu import LigerGELUMulFunction as Fn
        Fn.apply(a, b).backward(dc)

    return {
        "name": f"{'SwiGLU' if kind == 'swiglu' else 'GeGLU'} {n}x{h}",
        "bytes": 8 * n * h * 2,
        "bytes_note": "fwd: read a, b, write c; bwd: read a, b, dc, write da, db (bf16)",
        "grads": [a, b],
        "ours": lambda: ours(a, b).backward(dc),
        "peer": peer,
        "eager": lambda: eager(a, b).backward(dc),
    }


def case_rope():
    b, hq, hk, s, d = 4, 32, 8, 4096, 128
    q, k = _rand(b, hq, s, d), _rand(b, hk, s, d)
    ang = torch.randn(1, s, d // 2, device="cuda")
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(BF), ang.sin().to(BF)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    def run(fn):
        def f():
            qo, ko = fn(q, k, cos, sin)
            torch.autograd.backward((qo, ko), (gq, gk))

        return f

    def peer_fn(q_, k_, c_, s_):
        from liger_kernel.ops.rope import LigerRopeFunction

        return LigerRopeFunction.apply(q_, k_, c_, s_)

    n = q.numel() + k.numel()
    return {
        "name": f"RoPE q {b}x{hq}x{s}x{d} + k {b}x{hk}x{s}x{d}",
        "bytes": 4 * n * 2,
        "bytes_note": "fwd: read q, k, write q', k'; bwd: same on the grads (bf16; cos/sin not counted)",
        "grads": [q, k],
        "ours": run(K.rope),
        "peer": run(peer_fn),
        "eager": run(apply_rotary_pos_emb),
    }


def case_layer_norm():
    n, h = 16384, 4096
    x, w, bb = _rand(n, h), _rand(h), _rand(h)
    dy = torch.randn(n, h, device="cuda").to(BF)

    def peer():
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        LigerLayerNormFunction.apply(x, w, bb, 1e-5).backward(dy)

    return {
        "name": f"LayerNorm {n}x{h}",
        "bytes": 5 * n * h * 2,
        "bytes_note": "fwd: read x, write y; bwd: read x, dy, write dx (bf16)",
        "grads": [x, w, bb],
        "ours": lambda: K.layer_norm(x, w, bb, 1e-5).backward(dy),
        "peer": peer,
        "eager": lambda: F.layer_norm(x, (h,), w, bb, 1e-5).backward(dy),
    }


def case_cross_entropy():
    n, v = 4096, 128256
    logits = _rand(n, v, scale=2.0)
    t = torch.randint(0, v, (n,), device="cuda")

    def peer():
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

        out = LigerCrossEntropyFunction.apply(
            logits, t, None, -100, 0.0, 0.0, "mean", None, False, False, False
        )
        (out[0] if isinstance(out, tuple) else out).backward()

    return {
        "name": f"CrossEntropy {n}x{v}",
        "bytes": 3 * n * v * 2,
        "bytes_note": "read the logits twice (max/sum-exp, then gradient), write the gradient once (bf16)",
        "grads": [logits],
        "ours": lambda: K.cross_entropy(logits, t).backward(),
        # overwrites the logits with their gradient, as the peer always does (the values stay finite)
        "ours inplace": lambda: K.cross_entropy(logits, t, inplace_backward=True).backward(),
        "peer": peer,
        "eager": lambda: F.cross_entropy(logits.float(), t).backward(),
    }


CASES = [
    case_rms_norm,
    case_rope,
    lambda: _glu_case("swiglu"),
    lambda: _glu_case("geglu"),
    case_layer_norm,
    case_cross_entropy,
]


INFO_KEYS = ("name", "bytes", "bytes_note", "grads")
PROFILED = ("ours", "ours inplace", "peer")


def copy_bandwidth_gbs(args, nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth, counting bytes read + written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    timing = harness.measure({"copy": lambda: dst.copy_(src)}, warmup=args.warmup, repeats=args.repeats)
    return 2 * nbytes / (timing["copy"].median * 1e-3) / 1e9


def _walls(make, errors, args) -> dict | None:
    try:
        case = make()
    except Exception as e:  # noqa: BLE001
        errors.append(f"setup: {e!r}")
        traceback.print_exc()
        return None
    row = {"op": case["name"], "bytes": case["bytes"], "bytes_note": case["bytes_note"]}
    methods = {k: v for k, v in case.items() if k not in INFO_KEYS}
    failed: dict[str, BaseException] = {}
    timings = harness.measure(
        methods, warmup=args.warmup, repeats=args.repeats, grad_to_none=case["grads"], errors=failed
    )
    for key, timing in timings.items():
        row[f"{key}_ms"] = timing.median
        row[f"{key}_spread"] = timing.spread
    for key, exc in failed.items():
        errors.append(f"{case['name']} {key}: {exc!r}")
    return row


def _kernel_times(make, row, errors) -> None:
    case = make()
    for key in [k for k in PROFILED if k in case and f"{k}_ms" in row]:
        try:
            row[f"{key}_kernel_ms"] = harness.kernel_ms(
                case[key], case["grads"], label=f"{case['name']} {key}"
            )
        except Exception as e:  # noqa: BLE001
            errors.append(f"{case['name']} {key} kernel time: {e!r}")
            traceback.print_exc()


def _ratios(row, copy_gbs) -> None:
    gbs = lambda ms: row["bytes"] / (ms * 1e-3) / 1e9  # noqa: E731
    if "ours_ms" in row:
        row["ours_gbs"] = gbs(row["ours_ms"])
        row["ours_frac_copy"] = row["ours_gbs"] / copy_gbs
        if "peer_ms" in row:
            row["ours_vs_peer"] = row["ours_ms"] / row["peer_ms"]
            row["bar_met"] = row["ours_ms"] <= row["peer_ms"]
        if "eager_ms" in row:
            row["ours_vs_eager"] = row["ours_ms"] / row["eager_ms"]
    if "ours_kernel_ms" in row:
        row["ours_kernel_gbs"] = gbs(row["ours_kernel_ms"])
        row["ours_kernel_frac_copy"] = row["ours_kernel_gbs"] / copy_gbs


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--warmup", type=int, default=10, help="calls of each method before the timed ones")
    p.add_argument("--repeats", type=int, default=50, help="timed calls of each method, interleaved")
    harness.add_out_arg(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("ops: CUDA is not available")
        return 1
    results = harness.Results("ops", args.out)
    copy_gbs = copy_bandwidth_gbs(args)
    rows, errors = [], []
    for make in CASES:  # every wall first, before any profiler run
        row = _walls(make, errors, args)
        if row is not None:
            rows.append((make, row))
        torch.cuda.empty_cache()
    for make, row in rows:
        _kernel_times(make, row, errors)
        _ratios(row, copy_gbs)
        torch.cuda.empty_cache()
    rows = [row for _, row in rows]
    for row in rows:
        record(results, row)
    path = results.write({"copy_gbs": copy_gbs, "args": vars(args), "rows": rows, "errors": errors})
    print_table(results.env, copy_gbs, rows, path)
    for e in errors:
        print("ERROR", e)
    return 0


METRICS = ("_kernel_ms", "_kernel_gbs", "_ms", "_gbs", "_spread")


def record(results, row) -> None:
    """The row's measurements as CSV rows: ``<method>_<metric>`` keys."""
    for key, value in row.items():
        suffix = next((m for m in METRICS if key.endswith(m)), None)
        if suffix:
            results.add(row["op"], key.removesuffix(suffix), suffix[1:], value)


COLUMNS = [
    ("op", ""),
    ("ours ms", ".3f"),
    ("spread", ".1%"),
    ("peer ms", ".3f"),
    ("eager ms", ".3f"),
    ("ours/peer", ".3f"),
    ("ours/eager", ".3f"),
    ("GB/s", ".0f"),
    ("/copy", ".2f"),
    ("bar", ""),
]


def print_table(info, copy_gbs, rows, path) -> None:
    title = (
        f"Ops fwd+bwd bf16  {info.get('device')}  torch {info['torch']} triton {info['triton']}  "
        f"copy {copy_gbs:.0f} GB/s (read+write)  json: {path}"
    )
    lines = []
    for r in rows:
        bar = None if "bar_met" not in r else ("met" if r["bar_met"] else "MISSED")
        lines.append(
            [r["op"]]
            + [r.get(k) for k in ("ours_ms", "ours_spread", "peer_ms", "eager_ms", "ours_vs_peer")]
            + [r.get(k) for k in ("ours_vs_eager", "ours_gbs", "ours_frac_copy")]
            + [bar]
        )
        if "ours_kernel_ms" in r:
            lines.append(
                ["  GPU kernel ms: ours / peer", r["ours_kernel_ms"], None, r.get("peer_kernel_ms")]
                + [None, None, None, r["ours_kernel_gbs"], r["ours_kernel_frac_copy"], "(kernel)"]
            )
        for key in ("ours in-place bwd", "ours inplace"):
            if f"{key}_ms" in r:
                lines.append([f"  ({key})", r[f"{key}_ms"], r[f"{key}_spread"]] + [None] * 7)
    harness.print_table(COLUMNS, lines, title)
    for r in rows:
        print(f"  {r['op']}: bytes {r['bytes'] / 1e6:.0f} MB = {r['bytes_note']}")
        for key in ("ours in-place bwd", "ours inplace"):
            if f"{key}_kernel_ms" in r:
                print(f"  {r['op']} ({key}): GPU kernel {r[key + '_kernel_ms']:.3f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
