"""Memory-bound ops benchmark (GPU): ours vs liger-kernel 0.8.5 vs HF / PyTorch eager, forward and backward, bf16.

Every op at three token counts (``--tokens``, default 4096 = 1 x 4096, 16384, 32768 = 8 x 4096) with the model
widths of the Llama-3-8B shapes (hidden 4096, MLP 14336, 32 / 8 heads of 128, vocabulary 128256). Per op, shape
and method: the forward alone (the autograd graph recorded, as in training) and forward + backward, each as a
median wall (the harness: warm-up, then the methods of a case interleaved; CUDA events, so a call whose host
time exceeds its kernels shows it) and as GPU kernel time (torch.profiler: the op's own speed); the backward is
the difference. Achieved bandwidth (the bytes the op must move at least, stated per row as a formula, / time) is
reported as a fraction of a device-to-device copy measured in the same run, for the forward and the backward,
from the wall and from the kernel time. The walls of every case are taken first and the profiler runs
afterwards: Kineto can leave CUPTI attached after a profiler run (a known torch.profiler behaviour), which slowed
the launches of every case timed after the first profiled one. The peer is imported here only.
Usage: python -m benchmarks ops [--tokens 4096,16384,32768] [--ops rms_norm,...] [--repeats 50] [--out DIR]
       python -m benchmarks ops --cpu-smoke    # tiny widths on CPU, ours and eager: checks the script
"""

from __future__ import annotations

import argparse
import traceback

import torch
import torch.nn.functional as F

from benchmarks import harness
from liger_registry import kernels as K
from liger_registry.kernels.glu.reference import geglu_torch, swiglu_torch

WIDTHS = dict(hidden=4096, mlp=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)
SMOKE_WIDTHS = dict(hidden=64, mlp=96, heads=4, kv_heads=2, head_dim=16, vocab=512)
TOKENS = "4096,16384,32768"
SEQ = 4096  # RoPE's sequence length: tokens = batch x SEQ
# the fp32 eager cross entropy holds ~6 fp32 copies of the logits: beyond this many logits it is left out
EAGER_CE_MAX_LOGITS = 16384 * 128256
INFO_KEYS = ("name", "bytes_fwd", "bytes_bwd", "bytes_note", "grads", "douts")
PROFILED = ("ours", "ours inplace", "peer")
PHASES = ("fwd", "bwd")


class Env:
    """Where a case builds its tensors: device, dtype and widths (the GPU's bf16 model widths, or the smoke's)."""

    def __init__(self, smoke: bool):
        self.smoke = smoke
        self.device = "cpu" if smoke else "cuda"
        self.dtype = torch.float32 if smoke else torch.bfloat16
        self.w = SMOKE_WIDTHS if smoke else WIDTHS
        self.size = torch.finfo(self.dtype).bits // 8

    def rand(self, *shape, scale=1.0, grad=True):
        t = (torch.randn(*shape, device=self.device) * scale).to(self.dtype)
        return t.requires_grad_() if grad else t


def case_rms_norm(env: Env, n: int) -> dict:
    h = env.w["hidden"]
    x, w = env.rand(n, h), env.rand(h, scale=0.1)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(h, 1e-6).to(env.device, env.dtype)

    def peer():
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        return LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True)

    return {
        "name": f"RMSNorm {n}x{h}",
        "bytes_fwd": 2 * n * h * env.size,
        "bytes_bwd": 3 * n * h * env.size,
        "bytes_note": "fwd: read x, write y; bwd: read x, dy, write dx",
        "grads": [x, w],
        "douts": [env.rand(n, h, grad=False)],
        "ours": lambda: K.rms_norm(x, w, 1e-6),
        "ours in-place bwd": lambda: K.rms_norm(x, w, 1e-6, in_place_backward=True),
        "peer": peer,
        "eager": lambda: hf(x),
    }


def _glu_case(kind: str, env: Env, n: int) -> dict:
    h = env.w["mlp"]
    a, b = env.rand(n, h), env.rand(n, h)
    ours = K.swiglu if kind == "swiglu" else K.geglu
    eager = swiglu_torch if kind == "swiglu" else geglu_torch

    def peer():
        if kind == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction as Fn
        else:
            from liger_kernel.ops.geglu import LigerGELUMulFunction as Fn
        return Fn.apply(a, b)

    return {
        "name": f"{'SwiGLU' if kind == 'swiglu' else 'GeGLU'} {n}x{h}",
        "bytes_fwd": 3 * n * h * env.size,
        "bytes_bwd": 5 * n * h * env.size,
        "bytes_note": "fwd: read a, b, write c; bwd: read a, b, dc, write da, db",
        "grads": [a, b],
        "douts": [env.rand(n, h, grad=False)],
        "ours": lambda: ours(a, b),
        "peer": peer,
        "eager": lambda: eager(a, b),
    }


def case_swiglu(env: Env, n: int) -> dict:
    return _glu_case("swiglu", env, n)


def case_geglu(env: Env, n: int) -> dict:
    return _glu_case("geglu", env, n)


def case_rope(env: Env, n: int) -> dict:
    s = min(SEQ, n)
    b, hq, hk, d = n // s, env.w["heads"], env.w["kv_heads"], env.w["head_dim"]
    q, k = env.rand(b, hq, s, d), env.rand(b, hk, s, d)
    ang = torch.randn(1, s, d // 2, device=env.device)
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(env.dtype), ang.sin().to(env.dtype)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    def peer():
        from liger_kernel.ops.rope import LigerRopeFunction

        return LigerRopeFunction.apply(q, k, cos, sin)

    elems = q.numel() + k.numel()
    return {
        "name": f"RoPE q {b}x{hq}x{s}x{d} + k {b}x{hk}x{s}x{d}",
        "bytes_fwd": 2 * elems * env.size,
        "bytes_bwd": 2 * elems * env.size,
        "bytes_note": "fwd: read q, k, write q', k'; bwd: the same on the gradients (cos/sin not counted)",
        "grads": [q, k],
        "douts": [torch.randn_like(q), torch.randn_like(k)],
        "ours": lambda: K.rope(q, k, cos, sin),
        "peer": peer,
        "eager": lambda: apply_rotary_pos_emb(q, k, cos, sin),
    }


def case_layer_norm(env: Env, n: int) -> dict:
    h = env.w["hidden"]
    x, w, bb = env.rand(n, h), env.rand(h), env.rand(h)

    def peer():
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        return LigerLayerNormFunction.apply(x, w, bb, 1e-5)

    return {
        "name": f"LayerNorm {n}x{h}",
        "bytes_fwd": 2 * n * h * env.size,
        "bytes_bwd": 3 * n * h * env.size,
        "bytes_note": "fwd: read x, write y; bwd: read x, dy, write dx",
        "grads": [x, w, bb],
        "douts": [env.rand(n, h, grad=False)],
        "ours": lambda: K.layer_norm(x, w, bb, 1e-5),
        "peer": peer,
        "eager": lambda: F.layer_norm(x, (h,), w, bb, 1e-5),
    }


def case_cross_entropy(env: Env, n: int) -> dict:
    v = env.w["vocab"]
    logits = env.rand(n, v, scale=2.0)
    t = torch.randint(0, v, (n,), device=env.device)

    def peer():
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

        out = LigerCrossEntropyFunction.apply(
            logits, t, None, -100, 0.0, 0.0, "mean", None, False, False, False
        )
        return out[0] if isinstance(out, tuple) else out

    case = {
        "name": f"CrossEntropy {n}x{v}",
        # ours and the peer compute the gradient in the forward: the backward only scales it
        "bytes_fwd": 2 * n * v * env.size,
        "bytes_bwd": 2 * n * v * env.size,
        "bytes_note": "fwd: read the logits (statistics, then gradient), write the gradient; bwd: read it, "
        "write it scaled",
        "grads": [logits],
        "douts": [None],
        "ours": lambda: K.cross_entropy(logits, t),
        # overwrites the logits with their gradient, as the peer always does (the values stay finite)
        "ours inplace": lambda: K.cross_entropy(logits, t, inplace_backward=True),
        "peer": peer,
    }
    if n * v <= EAGER_CE_MAX_LOGITS:
        case["eager"] = lambda: F.cross_entropy(logits.float(), t)
    return case


CASES = {
    "rms_norm": case_rms_norm,
    "rope": case_rope,
    "swiglu": case_swiglu,
    "geglu": case_geglu,
    "layer_norm": case_layer_norm,
    "cross_entropy": case_cross_entropy,
}


def phases(fwd, douts):
    """``(forward alone, forward + backward)`` of a method whose call returns its output(s)."""

    def step():
        out = fwd()
        outs = out if isinstance(out, tuple | list) else (out,)
        if douts[0] is None:  # a loss
            outs[0].backward()
        else:
            torch.autograd.backward(list(outs[: len(douts)]), list(douts))

    return fwd, step


def copy_bandwidth_gbs(args, env: Env) -> float:
    """Device-to-device copy bandwidth, counting bytes read + written."""
    nbytes = 2 * 2**20 if env.smoke else 2 * 2**30
    src = torch.empty(nbytes // env.size, dtype=env.dtype, device=env.device).normal_()
    dst = torch.empty_like(src)
    timing = harness.measure({"copy": lambda: dst.copy_(src)}, warmup=args.warmup, repeats=args.repeats)
    return 2 * nbytes / (timing["copy"].median * 1e-3) / 1e9


def methods_of(case: dict, smoke: bool = False) -> dict:
    """``{"<method>" : step, "<method> fwd": forward}`` of every method of the case (no peer in the smoke)."""
    out = {}
    for key, fn in case.items():
        if key not in INFO_KEYS and not (smoke and key == "peer"):
            fwd, step = phases(fn, case["douts"])
            out[key], out[f"{key} fwd"] = step, fwd
    return out


def _walls(make, env: Env, n: int, errors: list, args) -> dict | None:
    try:
        case = make(env, n)
    except Exception as e:  # noqa: BLE001
        errors.append(f"setup {make.__name__} {n}: {e!r}")
        traceback.print_exc()
        return None
    row = {"op": case["name"], "tokens": n, **{k: case[k] for k in ("bytes_fwd", "bytes_bwd", "bytes_note")}}
    row["bytes"] = row["bytes_fwd"] + row["bytes_bwd"]
    failed: dict[str, BaseException] = {}
    timings = harness.measure(
        methods_of(case, env.smoke),
        warmup=args.warmup,
        repeats=args.repeats,
        grad_to_none=case["grads"],
        errors=failed,
    )
    for key, timing in timings.items():
        name = key.removesuffix(" fwd")
        row[f"{name}_fwd_ms" if key.endswith(" fwd") else f"{name}_ms"] = timing.median
        row[f"{key.replace(' fwd', '_fwd')}_spread"] = timing.spread
    for key, exc in failed.items():
        errors.append(f"{case['name']} {key}: {exc!r}")
    return row


def _kernel_times(make, env: Env, row, errors) -> None:
    case = make(env, row["tokens"])
    methods = methods_of(case)
    for key in [k for k in PROFILED if k in case and f"{k}_ms" in row]:
        try:
            row[f"{key}_kernel_ms"] = harness.kernel_ms(
                methods[key], case["grads"], label=f"{case['name']} {key}"
            )
            row[f"{key}_fwd_kernel_ms"] = harness.kernel_ms(methods[f"{key} fwd"], case["grads"])
        except Exception as e:  # noqa: BLE001
            errors.append(f"{case['name']} {key} kernel time: {e!r}")
            traceback.print_exc()


def _ratios(row, copy_gbs) -> None:
    """Backward = step - forward; per method and phase GB/s and the fraction of the copy, wall and kernel."""
    for key in [k.removesuffix("_fwd_ms") for k in list(row) if k.endswith("_fwd_ms")]:
        for kind in ("", "_kernel"):
            step, fwd = row.get(f"{key}{kind}_ms"), row.get(f"{key}_fwd{kind}_ms")
            if step is None or fwd is None:
                continue
            # a step timed below its forward is noise: no backward time, rather than an absurd bandwidth
            row[f"{key}_bwd{kind}_ms"] = step - fwd if step > fwd else None
            for phase in [p for p in PHASES if row[f"{key}_{p}{kind}_ms"] is not None]:
                gbs = row[f"bytes_{phase}"] / (row[f"{key}_{phase}{kind}_ms"] * 1e-3) / 1e9
                row[f"{key}_{phase}{kind}_gbs"] = gbs
                row[f"{key}_{phase}{kind}_frac_copy"] = gbs / copy_gbs
            row[f"{key}{kind}_gbs"] = row["bytes"] / (step * 1e-3) / 1e9
            row[f"{key}{kind}_frac_copy"] = row[f"{key}{kind}_gbs"] / copy_gbs
    if "ours_ms" in row:
        if "peer_ms" in row:
            row["ours_vs_peer"] = row["ours_ms"] / row["peer_ms"]
            row["bar_met"] = row["ours_ms"] <= row["peer_ms"]
        if "eager_ms" in row:
            row["ours_vs_eager"] = row["ours_ms"] / row["eager_ms"]


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default=TOKENS, help="comma list of token counts (rows of every op)")
    p.add_argument("--ops", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    p.add_argument("--warmup", type=int, default=10, help="calls of each method before the timed ones")
    p.add_argument("--repeats", type=int, default=50, help="timed calls of each method, interleaved")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny widths on CPU, 64 tokens, ours and eager")
    harness.add_out_arg(p)
    args = p.parse_args(argv)
    unknown = set(args.ops.split(",")) - set(CASES)
    if unknown:
        p.error(f"unknown ops {sorted(unknown)} (known: {', '.join(CASES)})")
    if args.cpu_smoke:
        args.tokens = "64" if args.tokens == TOKENS else args.tokens
        args.warmup, args.repeats = min(args.warmup, 1), min(args.repeats, 3)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("ops: CUDA is not available (--cpu-smoke runs the script on the CPU)")
        return 1
    env = Env(args.cpu_smoke)
    results = harness.Results("ops", args.out, tag="smoke" if args.cpu_smoke else "")
    copy_gbs = copy_bandwidth_gbs(args, env)
    rows, errors = [], []
    plan = [(CASES[op], int(n)) for op in args.ops.split(",") for n in args.tokens.split(",")]
    for make, n in plan:  # every wall first, before any profiler run
        row = _walls(make, env, n, errors, args)
        if row is not None:
            rows.append((make, row))
        if not env.smoke:
            torch.cuda.empty_cache()
    for make, row in rows:
        if not env.smoke:  # kernel time needs the CUDA profiler
            _kernel_times(make, env, row, errors)
            torch.cuda.empty_cache()
        _ratios(row, copy_gbs)
    rows = [row for _, row in rows]
    for row in rows:
        record(results, row)
    path = results.write({"copy_gbs": copy_gbs, "args": vars(args), "rows": rows, "errors": errors})
    print_table(results.env, copy_gbs, rows, path)
    for e in errors:
        print("ERROR", e)
    return 0 if rows and not errors else 1


METRICS = ("_kernel_frac_copy", "_frac_copy", "_kernel_ms", "_kernel_gbs", "_ms", "_gbs", "_spread")


def record(results, row) -> None:
    """The row's measurements as CSV rows: ``<method>[_fwd|_bwd]_<metric>`` keys."""
    for key, value in row.items():
        suffix = next((m for m in METRICS if key.endswith(m)), None)
        if suffix and not key.startswith("bytes"):
            results.add(row["op"], key.removesuffix(suffix), suffix[1:], value)


COLUMNS = [
    ("op", ""),
    ("method", ""),
    ("fwd ms", ".3f"),
    ("bwd ms", ".3f"),
    ("fwd+bwd", ".3f"),
    ("vs peer", ".3f"),
    ("fwd kern", ".3f"),
    ("bwd kern", ".3f"),
    ("fwd /copy", ".2f"),
    ("bwd /copy", ".2f"),
    ("fwd k/copy", ".2f"),
    ("bwd k/copy", ".2f"),
]
SHOWN = ("ours", "ours in-place bwd", "ours inplace", "peer", "eager")


def table_lines(rows) -> list[list]:
    """One line per op, shape and method: walls and kernel times per phase, the fractions of the copy."""
    lines = []
    for r in rows:
        for m in [m for m in SHOWN if f"{m}_ms" in r]:
            vs = r[f"{m}_ms"] / r["peer_ms"] if "peer_ms" in r else None
            lines.append(
                [r["op"] if m == "ours" else "", m]
                + [r.get(f"{m}_{k}") for k in ("fwd_ms", "bwd_ms", "ms")]
                + [vs]
                + [r.get(f"{m}_{k}") for k in ("fwd_kernel_ms", "bwd_kernel_ms")]
                + [r.get(f"{m}_{k}") for k in ("fwd_frac_copy", "bwd_frac_copy")]
                + [r.get(f"{m}_{k}") for k in ("fwd_kernel_frac_copy", "bwd_kernel_frac_copy")]
            )
    return lines


def print_table(info, copy_gbs, rows, path) -> None:
    title = (
        f"Ops forward / backward  {info.get('device')}  torch {info['torch']} triton {info['triton']}  "
        f"copy {copy_gbs:.1f} GB/s (read+write); wall = time around the call, kern = GPU kernel time; json: {path}"
    )
    harness.print_table(COLUMNS, table_lines(rows), title)
    for r in rows:
        bar = None if "bar_met" not in r else ("met" if r["bar_met"] else "MISSED")
        print(f"  {r['op']}: fwd {r['bytes_fwd'] / 1e6:.0f} MB, bwd {r['bytes_bwd'] / 1e6:.0f} MB "
              f"({r['bytes_note']}); ours <= peer wall: {bar or '?'}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
