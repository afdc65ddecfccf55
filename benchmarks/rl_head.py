"""RL head benchmark: per-token log-probs and entropy of the head, forward + backward, at GRPO shapes.

Heads: Qwen3-1.7B (H=2048, V=151936) and Llama-3-8B (H=4096, V=128256); 8192, 16384, 32768 tokens (the counted
completion tokens of a GRPO micro-batch); bf16; hidden ~ N(0, 1), weight ~ N(0, 0.02^2), uniform targets. The
loss is ``sum(a * log_probs) + sum(b * entropy)`` with fixed random per-token weights ``a``, ``b`` (what GRPO's
policy term and entropy bonus send back), gradients w.r.t. hidden and weight. Rows:

- ``ours``: ``kernels.fused_linear_logprobs`` (log-probs and entropy); ``ours 1GiB``: the same at a 1 GiB tile;
- ``ours log-probs``: log-probs only (what the reference model and a loss without entropy ask for);
- ``trl`` / ``trl log-probs``: TRL's fused head (``trl.kernels.ChunkedLogProbFunction``, the 32768-column vocabulary
  tile its ``add_fused_lm_head`` uses);
- ``liger flce``: liger-kernel 0.8.5's fused linear cross entropy with ``reduction="sum"`` (per-token log-probs
  summed: its gradient is computed in the forward, so it needs one GEMM less and gives no entropy; the peer,
  imported here only, installed on the GPU runner);
- ``full logits``: the materialised bf16 logits, ``log_softmax`` in fp32, gather and entropy under autograd.

Per row: median ms (the harness: warmed up, interleaved), incremental peak MiB, ratios to ``trl`` and ``full
logits`` of the same run; and, per group, the largest relative difference of ours from TRL's log-probs and
entropy. JSON ``rows`` and the CSV through the harness; the table is printed last.

Usage: python -m benchmarks rl_head [--shapes qwen3_1_7b,llama3_8b] [--tokens 8192,16384] [--methods ...]
       python -m benchmarks rl_head --cpu-smoke      # tiny fp32 shapes on CPU: checks the script, measures nothing
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import harness
from liger_registry.kernels import fused_linear_logprobs

SHAPES = {"qwen3_1_7b": (2048, 151936), "llama3_8b": (4096, 128256)}
SMOKE_SHAPES = {"qwen3_1_7b": (32, 600), "llama3_8b": (48, 500)}
TOKENS = (8192, 16384, 32768)
SMOKE_TOKENS = (64, 200)
TRL_TILE = 32768  # the vocabulary tile TRL's add_fused_lm_head passes its head
BOTH = ("log_probs", "entropy")
METHODS = ("ours", "ours 1GiB", "ours log-probs", "trl", "trl log-probs", "liger flce", "full logits")
PEERS = {"trl": "trl", "trl log-probs": "trl", "liger flce": "liger"}
BASELINES = ("trl", "full logits")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--tokens", default=None, help="comma list of token counts (default 8192,16384,32768)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of row names")
    p.add_argument("--warmup", type=int, default=2, help="warm-up calls of each row")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each row")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--cpu-smoke", action="store_true", help="tiny fp32 shapes on CPU, wall-clock timing, no peer"
    )
    harness.add_out_arg(p)
    return p.parse_args(argv)


# --- the rows' calls: each returns the loss, then backward ------------------------------------------------------


def _weighted(lp, ent, a, b):
    return (lp * a).sum() + (0.0 if ent is None else (ent * b).sum())


def ours_loss(x, w, t, a, b, temperature, outputs=BOTH, max_tile_mib=None):
    out = fused_linear_logprobs(x, w, t, temperature=temperature, outputs=outputs, max_tile_mib=max_tile_mib)
    return _weighted(out.log_probs, out.entropy, a, b)


def trl_loss(x, w, t, a, b, temperature, outputs=BOTH):
    from trl.kernels import ChunkedLogProbFunction

    lp, ent, *_ = ChunkedLogProbFunction.apply(x, w, None, t, temperature, TRL_TILE, None, 1.0, outputs)
    return _weighted(lp, ent, a, b)


def liger_loss(x, w, t, a, b, temperature):
    """liger-kernel 0.8.5's FLCE (positional autograd signature), summed per-token negative log-probs at the
    temperature (the hidden states divided by it: no softcap here)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    flags = (None, None, -100, 0.0, 0.0, "sum", None, False, None, False, False, False, None, None)
    out = LigerFusedLinearCrossEntropyFunction.apply(x / temperature, w, t, *flags, 1)
    return -(out[0] if isinstance(out, tuple) else out)


def full_loss(x, w, t, a, b, temperature):
    logp = torch.log_softmax((x @ w.t()).float() / temperature, -1)
    lp = logp.gather(-1, t[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return _weighted(lp, ent, a, b)


def method_loss(name: str):
    """The loss function of a row name (all take ``x, w, t, a, b, temperature``)."""
    return {
        "ours": ours_loss,
        "ours 1GiB": lambda *args: ours_loss(*args, max_tile_mib=1024),
        "ours log-probs": lambda *args: ours_loss(*args, outputs=("log_probs",)),
        "trl": trl_loss,
        "trl log-probs": lambda *args: trl_loss(*args, outputs=("log_probs",)),
        "liger flce": liger_loss,
        "full logits": full_loss,
    }[name]


def peer_problems(cuda: bool) -> dict[str, str]:
    """Why a peer's rows cannot run ({} when every peer imports)."""
    problems = {}
    try:
        import trl.kernels  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        problems["trl"] = f"trl not importable: {exc!r}"[:200]
    if not cuda:
        problems["liger"] = "liger needs CUDA"
        return problems
    try:
        import liger_kernel.ops.fused_linear_cross_entropy  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        problems["liger"] = f"liger-kernel not importable: {exc!r}"[:200]
    return problems


# --- one (shape, tokens) group ----------------------------------------------------------------------------------


def inputs(h: int, v: int, n: int, device, dtype, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, h, device=device, generator=g).to(dtype).requires_grad_()
    w = (0.02 * torch.randn(v, h, device=device, generator=g)).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), device=device, generator=g)
    a = torch.randn(n, device=device, generator=g)
    b = 0.01 * torch.randn(n, device=device, generator=g)
    return x, w, t, a, b


def agreement(x, w, t, temperature) -> dict[str, float]:
    """Largest relative difference of our log-probs and entropy from TRL's, on the group's inputs."""
    from trl.kernels import ChunkedLogProbFunction

    with torch.no_grad():
        ours = fused_linear_logprobs(x, w, t, temperature=temperature)
        lp, ent, *_ = ChunkedLogProbFunction.apply(x, w, None, t, temperature, TRL_TILE, None, 1.0, BOTH)
    rel = lambda a, r: ((a - r).abs().max() / r.abs().max().clamp(min=1e-30)).item()  # noqa: E731
    return {"log_probs": rel(ours.log_probs, lp), "entropy": rel(ours.entropy, ent)}


def without_frames(fn):
    """``fn`` whose out-of-memory error is raised afresh after the original is gone: the original's traceback
    holds the failed call's frames, whose tensors (materialised logits) would stay allocated for the other rows."""

    def call():
        message = None
        try:
            fn()
        except torch.OutOfMemoryError as exc:
            message = str(exc)
        if message is not None:
            raise torch.OutOfMemoryError(message)

    return call


def run_group(shape, h, v, n, args, methods, problems, device, dtype) -> list[dict]:
    x, w, t, a, b = inputs(h, v, n, device, dtype)
    grads = (x, w)
    fns, rows = {}, {}
    for name in methods:
        row = {"shape": shape, "H": h, "V": v, "tokens": n, "method": name, "family": PEERS.get(name, name)}
        rows[name] = row
        why = problems.get(PEERS.get(name, ""))
        if why:
            row.update(ok=False, error=why)
            continue
        loss = method_loss(name)
        fns[name] = without_frames(lambda loss=loss: loss(x, w, t, a, b, args.temperature).backward())
    errors: dict[str, BaseException] = {}
    timings = harness.measure(
        fns,
        warmup=args.warmup,
        repeats=args.repeats,
        grad_to_none=grads,
        cuda=device == "cuda",
        errors=errors,
    )
    for name, exc in errors.items():
        harness.record_failure(rows[name], exc)
    for name, timing in timings.items():
        rows[name].update(ok=True, ms=timing.median, spread=timing.spread)
        try:
            rows[name]["peak_mib"] = harness.peak_mib(fns[name], clear=grads)
        except Exception as exc:  # noqa: BLE001 - a row that ran but cannot be measured keeps its time
            rows[name]["peak_error"] = f"{type(exc).__name__}: {exc}"[:200]
    for r in rows.values():
        for base in BASELINES:
            if r.get("ms") and rows.get(base, {}).get("ms"):
                r[f"x_{base.replace(' ', '_')}"] = r["ms"] / rows[base]["ms"]
    check = agreement(x, w, t, args.temperature) if "trl" not in problems else {}
    rows_out = list(rows.values())  # the group's tensors are freed when it returns
    for r in rows_out:
        if r["family"] == "ours" and check:
            r["vs_trl_rel"] = check
    return rows_out


def record(results: harness.Results, rows: list[dict]) -> None:
    for r in rows:
        case = f"{r['shape']} N={r['tokens']}"
        for key in ("ms", "peak_mib", *(f"x_{b.replace(' ', '_')}" for b in BASELINES)):
            results.add(case, r["method"], key, r.get(key))


def print_table(rows: list[dict], meta: dict) -> None:
    cols = [("shape", ""), ("N", ">"), ("method", ""), ("ms", ".2f"), ("peak MiB", ".0f"), ("x trl", ".3f")]
    cols += [("x full", ".3f"), ("error", "")]
    body = [
        [r["shape"], r["tokens"], r["method"], r.get("ms"), r.get("peak_mib"), r.get("x_trl")]
        + [r.get("x_full_logits"), r.get("error", "")[:60]]
        for r in rows
    ]
    harness.print_table(cols, body, title=f"RL head fwd+bwd ({meta['dtype']}, {meta['device']})")
    checks = {(r["shape"], r["tokens"]): r["vs_trl_rel"] for r in rows if "vs_trl_rel" in r}
    worst = max((max(c.values()) for c in checks.values()), default=None)
    print(f"ours vs trl, largest relative difference of log-probs / entropy over the groups: {worst}")


def main(argv=None) -> int:
    args = parse(argv)
    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        print("rl_head: CUDA is not available (use --cpu-smoke to check the script on CPU)")
        return 2
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES if cuda else SMOKE_SHAPES
    tokens = [int(n) for n in args.tokens.split(",")] if args.tokens else (TOKENS if cuda else SMOKE_TOKENS)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        print(f"rl_head: unknown methods {unknown}; expected among {list(METHODS)}")
        return 2
    problems = peer_problems(cuda)
    start = time.perf_counter()
    rows = []
    for shape in args.shapes.split(","):
        h, v = shapes[shape]
        for n in tokens:
            rows += run_group(shape, h, v, n, args, methods, problems, device, dtype)
    results = harness.Results("rl_head", args.out)
    meta = {
        "dtype": str(dtype).removeprefix("torch."),
        "device": results.env["device_slug"],
        "warmup": args.warmup,
        "repeats": args.repeats,
        "temperature": args.temperature,
        "wall_s": time.perf_counter() - start,
        "errors": sum(1 for r in rows if not r.get("ok")),
        "json": str(results.path("json")),
    }
    record(results, rows)
    results.write({"meta": meta, "args": vars(args), "problems": problems, "rows": rows})
    print_table(rows, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
