"""FLCE benchmark: tokens per step x two head shapes; floor, unpatched, liger-kernel, ours per plan.

Shapes: Llama-3 (H=4096, V=128256) and GPT-OSS (H=2880, V=201088); BT = 2048, 4096, 8192, 16384 tokens; bf16,
forward + backward w.r.t. hidden and weight. Data: hidden ~ N(0,1), weight ~ N(0, 0.02^2), uniform targets
("random"); with --peaked also hidden aligned with the target row (a confident model). Per row: median ms (the
harness: every row of a (shape, BT) group warmed up, then their calls interleaved), incremental peak MiB (max_memory_allocated during one step minus what was allocated
before: inputs and weight excluded, gradients included), and for ours the plan of kernels.flce_plan (strategy,
chunk sizes). Rows: the 3-GEMM floor (logits, dX, dW as bare cuBLAS GEMMs), unpatched (materialised logits +
F.cross_entropy, what HF does), liger-kernel 0.8.5 at C=1 and C=8 (peer, imported here only),
cut-cross-entropy's linear_cross_entropy (peer, imported here only when installed, else its rows say
"skipped: not installed"; `cce`: its default impl, which skips gradient terms below bf16 resolution, and
`cce exact`: impl cce_exact, no skipping), ours at the
default budget, at C=8, with the `throughput` budget (max_chunk_mib=512), and forced tokens / forced vocab at
the default budget (to check the planner's choice). The targets are evaluated per row. A loss and
gradient check against float64 runs on one small shape. JSON under --out; the table is printed last.
Besides ``rows`` of the run's own names, each row carries ``head`` (the shape), ``tokens``, ``family`` (floor,
unpatched, liger, cce, ours) and ``ms``, the random-input median.

Two more modes: ``--strategies`` times each FLCE strategy forced, against the planner's predicted ms (the cost
model's calibration, docs/design/flce-cost-model.md), and ``--plan-table`` prints the planner's choice and
predicted ms for the shapes without timing anything (no GPU needed; ``--gpu`` names the device's peaks).

Usage: python -m benchmarks flce [--quick] [--peaked] [--shapes llama,gpt_oss] [--bt 2048,4096]
       python -m benchmarks flce --cpu-smoke     # tiny shapes on CPU: checks the script, measures nothing
       python -m benchmarks flce --strategies [--quick]
       python -m benchmarks flce --plan-table [--gpu "NVIDIA H200"]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks import harness
from liger_registry import kernels as K

SHAPES = {"llama": (4096, 128256), "gpt_oss": (2880, 201088), "qwen3": (4096, 151936)}
DEFAULT_SHAPES = ("llama", "gpt_oss")
SMOKE_SHAPES = {"llama": (32, 500), "gpt_oss": (24, 700), "qwen3": (32, 600)}
BTS = (2048, 4096, 8192, 16384)
SMOKE_BTS = (64, 256)
THROUGHPUT_MIB = 512
# (row name, kind, keyword arguments of ours / chunk_mem_const of the peer)
METHODS = (
    ("floor", "floor", {}),
    ("unpatched", "unpatched", {}),
    ("peer C=1", "peer", {"chunk_mem_const": 1}),
    ("peer C=8", "peer", {"chunk_mem_const": 8}),
    ("cce", "cce", {"impl": "cce"}),
    ("cce exact", "cce", {"impl": "cce_exact"}),
    ("ours default", "ours", {}),
    ("ours C=8", "ours", {"chunk_mem_const": 8}),
    ("ours throughput", "ours", {"max_chunk_mib": THROUGHPUT_MIB}),
    ("ours tokens", "ours", {"strategy": "tokens"}),
    ("ours vocab", "ours", {"strategy": "vocab"}),
    # vocab layouts for A/B, whatever the cost model chooses: only pass 1's last chunk kept (the layout before
    # kept_geometry), and every chunk kept where that applies (N <= H)
    ("ours 1-kept", "ours_layout", {"strategy": "vocab"}),
    ("ours all-kept", "ours_layout", {"strategy": "vocab"}),
)
# the vocab layout of each "ours_layout" row: vocab_geometry's keep
LAYOUTS = {"ours 1-kept": False, "ours all-kept": True}
# rows the targets compare: timed twice, interleaved with the others, best of the two medians
REPEATED = ("floor", "unpatched", "peer C=1", "cce", "ours default", "ours throughput")
# row kinds of other libraries, for the peers target: ours default no slower than every peer at or below its peak
PEERS = ("peer", "cce")
PLAN_COST_FIELDS = ("predicted_ms", "cost_ms", "est_ms", "time_ms")
# the library each row kind stands for, in the rows' "family" key
FAMILIES = {"floor": "floor", "unpatched": "unpatched", "peer": "liger", "cce": "cce", "ours": "ours"}
FAMILIES["ours_layout"] = "ours"
# the strategy calibration (--strategies): budgets of the planner, shapes from SHAPES
BUDGETS = {"C=1": {"chunk_mem_const": 1}, "C=8": {"chunk_mem_const": 8}, "512MiB": {"max_chunk_mib": 512}}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~1 minute subset: BT 2048 and 8192 of both shapes")
    p.add_argument("--peaked", action="store_true", help="also time every row on confident ('peaked') inputs")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--bt", default=None, help="comma list of tokens per call (default 2048,4096,8192,16384)")
    p.add_argument("--methods", default=None, help="comma list of row names (default: all)")
    p.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up of each row (ms of running)")
    p.add_argument("--rep-ms", type=float, default=300.0, help="timed calls of each row (ms of running)")
    p.add_argument(
        "--no-repeat", dest="repeat", action="store_false", help="time the compared rows once, not twice"
    )
    p.add_argument(
        "--cpu-smoke", action="store_true", help="tiny fp32 shapes on CPU, wall-clock timing, no peer"
    )
    p.add_argument(
        "--strategies", action="store_true", help="time each strategy forced against the cost model"
    )
    p.add_argument("--plan-table", action="store_true", help="print the planner's choices; times nothing")
    p.add_argument(
        "--gpu", default="NVIDIA H200", help="--plan-table: the device whose peaks the planner uses"
    )
    harness.add_out_arg(p)
    args = p.parse_args(argv)
    if args.quick and not args.cpu_smoke:
        args.bt = args.bt or "2048,8192"
        args.warmup_ms, args.rep_ms = min(args.warmup_ms, 25.0), min(args.rep_ms, 100.0)
    return args


# --- the API of kernels this script calls; it may be missing on a branch where the planner is not merged


def probe_api() -> dict[str, str | None]:
    """Which of the FLCE budget keywords the installed kernels accept: None if accepted, else why not."""
    h, w, t = torch.randn(4, 8), torch.randn(16, 8), torch.randint(0, 16, (4,))
    found: dict[str, str | None] = {}
    for kw in ({"chunk_mem_const": 8}, {"max_chunk_mib": 1.0}, {"strategy": "tokens"}, {"strategy": "vocab"}):
        key = "=".join(str(x) for x in next(iter(kw.items())))
        try:
            K.fused_linear_cross_entropy(h, w, t, **kw)
            found[key] = None
        except Exception as exc:  # noqa: BLE001 - any failure means: not usable in this run
            found[key] = f"fused_linear_cross_entropy({key}) failed: {type(exc).__name__}: {exc}"[:200]
    found["flce_plan"] = (
        None if callable(getattr(K, "flce_plan", None)) else "liger_registry.kernels.flce_plan missing"
    )
    return found


def api_problem(kwargs: dict, api: dict[str, str | None]) -> str | None:
    for key, val in kwargs.items():
        probe = (
            f"{key}={val}" if key == "strategy" else next((k for k in api if k.startswith(key + "=")), None)
        )
        if probe and api.get(probe):
            return f"API missing: {api[probe]}"
    return None


def plan_of(bt: int, h: int, v: int, kwargs: dict, dtype, api) -> tuple[dict | None, str]:
    """(plan as a dict, short text) of ours for these keyword arguments; text says why when there is none."""
    if api["flce_plan"]:
        return None, "n/a (no flce_plan)"
    try:
        plan = K.flce_plan(bt, h, v, dtype=dtype, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return None, f"plan error: {type(exc).__name__}: {exc}"[:80]
    d = dataclasses.asdict(plan) if dataclasses.is_dataclass(plan) else dict(vars(plan))
    d = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in d.items()}
    d["str"] = str(plan)
    s = d.get("strategy", "?")
    chunk = d.get("chunk_tokens") if s == "tokens" else d.get("chunk_vocab")
    if d.get("scratch"):  # vocab with its widest chunks in dW's memory: pass-1 + pass-2 chunks, the widest
        return d, f"vocab {d.get('pass1_chunks')}+{d.get('num_chunks')} <={d.get('widest')}"
    return d, f"{s} {chunk}x{d.get('num_chunks', '?')}"


def plan_cost(plan: dict | None) -> float | None:
    return next((plan[k] for k in PLAN_COST_FIELDS if plan and isinstance(plan.get(k), (int, float))), None)


# --- data and the functions timed


def make_weight(h: int, v: int, device, dtype) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(v, h, device=device, generator=g) * 0.02).to(dtype).requires_grad_()


def make_hidden(bt: int, w: torch.Tensor, kind: str, seed: int = 1):
    v, h = w.shape
    g = torch.Generator(device=w.device).manual_seed(seed)
    t = torch.randint(0, v, (bt,), device=w.device, generator=g)
    x = torch.randn(bt, h, device=w.device, generator=g)
    if kind == "peaked":  # target logit ~ 20 above the rest: loss near 0, a confident model
        wt = w.detach()[t].float()
        x = wt * (20.0 / wt.pow(2).sum(-1, keepdim=True)) + x * 0.5
    return x.to(w.dtype).requires_grad_(), t


def floor_fn(x, w):
    """The three bare GEMMs of this size: logits [BT,V], dX [BT,H], dW [V,H]; a random logits gradient."""
    xd, wd = x.detach(), w.detach()
    g = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype).normal_()
    dx, dw = torch.empty_like(xd), torch.empty_like(wd)

    def f():
        torch.mm(xd, wd.t(), out=g)
        torch.mm(g, wd, out=dx)
        torch.mm(g.t(), xd, out=dw)

    return f


def unpatched_fn(x, w, t):
    return lambda: F.cross_entropy((x @ w.t()).float(), t).backward()


def peer_loss(x, w, t, chunk_mem_const: int):
    """The peer's FLCE loss (liger-kernel 0.8.5's positional autograd signature), mean over tokens."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    flags = (None, None, -100, 0.0, 0.0, "mean", None, False, None, False, False, False, None, None)
    out = LigerFusedLinearCrossEntropyFunction.apply(x, w, t, *flags, chunk_mem_const)
    return out[0] if isinstance(out, tuple) else out


def peer_fn(x, w, t, chunk_mem_const: int):
    return lambda: peer_loss(x, w, t, chunk_mem_const).backward()


def cce_loss(x, w, t, impl: str):
    """cut-cross-entropy's fused loss (mean over tokens); the package is a benchmark-only peer, imported here."""
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(x, w, t, impl=impl, reduction="mean")


def cce_fn(x, w, t, impl: str):
    return lambda: cce_loss(x, w, t, impl).backward()


def ours_fn(x, w, t, kwargs: dict):
    return lambda: K.fused_linear_cross_entropy(x, w, t, **kwargs).backward()


def ours_layout_fn(x, w, t, kwargs: dict, keep: bool):
    """``ours_fn`` with the vocab layout ``keep`` instead of the cost model's: False keeps only pass 1's last chunk,
    True every chunk where that applies (``vocab_geometry(keep=...)``)."""
    from liger_registry.kernels.flce import vocab as flce_vocab

    real = flce_vocab.vocab_geometry

    def layout(n, h, v, width, scratch, multiple=128, _keep=True):
        return real(n, h, v, width, scratch, multiple, keep)

    def run():
        flce_vocab.vocab_geometry = layout
        try:
            K.fused_linear_cross_entropy(x, w, t, **kwargs).backward()
        finally:
            flce_vocab.vocab_geometry = real

    return run


def timed_fn(kind: str, kwargs: dict, x, w, t, name: str = ""):
    if kind == "floor":
        return floor_fn(x, w)
    if kind == "unpatched":
        return unpatched_fn(x, w, t)
    if kind == "peer":
        return peer_fn(x, w, t, kwargs["chunk_mem_const"])
    if kind == "cce":
        return cce_fn(x, w, t, kwargs["impl"])
    if kind == "ours_layout":
        return ours_layout_fn(x, w, t, kwargs, LAYOUTS[name])
    return ours_fn(x, w, t, kwargs)


class Timer:
    """The harness's timing with this run's budgets: ms budgets on CUDA, 1 warm-up + 3 calls on the CPU."""

    def __init__(self, cuda: bool, warmup_ms: float, rep_ms: float):
        self.cuda, self.warmup_ms, self.rep_ms = cuda, warmup_ms, rep_ms

    def measure(self, fns: dict, grads, errors: dict) -> dict[str, harness.Timing]:
        if self.cuda:
            budget = {"warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms}
        else:
            budget = {"warmup": 1, "repeats": 3}
        return harness.measure(fns, grad_to_none=grads, cuda=self.cuda, errors=errors, **budget)

    def peak_mib(self, fn, grads) -> float | None:
        return harness.peak_mib(fn, clear=grads) if self.cuda else None


# --- one (shape, BT) group of rows


def row_head(name, kind, kwargs, bt, ctx) -> dict:
    """A row's identity and plan; "error" when the installed kernels or peers cannot run it."""
    w = ctx["w"]
    h, v = w.shape[1], w.shape[0]
    row = {"shape": ctx["shape"], "H": h, "V": v, "BT": bt, "method": name, "kind": kind, "kwargs": kwargs}
    row.update(head=ctx["shape"], tokens=bt, family=FAMILIES[kind])
    if kind == "ours":
        row["plan"], row["plan_text"] = plan_of(bt, h, v, kwargs, w.dtype, ctx["api"])
    elif kind == "ours_layout":
        row["plan_text"] = "vocab, all kept" if LAYOUTS[name] else "vocab, 1 kept"
    elif kind == "peer":
        chunk, n = K.flce_chunk_geometry(bt, h, v, kwargs["chunk_mem_const"])
        row["plan_text"] = f"tokens {chunk}x{n}"
    elif kind == "cce":
        row["plan_text"] = f"impl {kwargs['impl']}"
    skip = api_problem(kwargs, ctx["api"]) if kind in ("ours", "ours_layout") else ctx["problems"].get(kind)
    if skip:
        row["error"] = skip
    return row


def measure_rows(rows, methods, data, timer, w) -> None:
    """Every runnable row of the group timed together (interleaved) per input kind; the peak of each apart."""
    live = [(n, k, kw) for n, k, kw in methods if "error" not in rows[n]]
    for label, (xx, tt) in data.items():
        fns = {name: timed_fn(kind, kwargs, xx, w, tt, name) for name, kind, kwargs in live}
        failed: dict[str, BaseException] = {}
        timings = timer.measure(fns, [xx, w], failed)
        for name, timing in timings.items():
            rows[name][f"{label}_ms"] = timing.median
            rows[name][f"{label}_iqr"] = timing.spread
        for name, exc in failed.items():
            rows[name]["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if label == "random":
            for name, kind, _ in live:
                if name in timings and kind != "floor":
                    rows[name]["peak_mib"] = timer.peak_mib(fns[name], [xx, w])
        xx.grad = w.grad = None
        del fns
        gc.collect()
        if timer.cuda:
            torch.cuda.empty_cache()


def judge(rows: list[dict]) -> None:
    """Ratios vs unpatched, peer C=1, cce and the floor; the targets per row ('met' / 'MISSED')."""
    by = {r["method"]: r.get("random_ms") for r in rows}
    peers = [r for r in rows if r["kind"] in PEERS and r.get("random_ms") is not None]
    for r in rows:
        ms = r.get("random_ms")
        if ms is None:
            continue
        for ref, key in (
            ("unpatched", "x_unpatched"),
            ("peer C=1", "x_peer1"),
            ("cce", "x_cce"),
            ("floor", "x_floor"),
        ):
            if by.get(ref):
                r[key] = ms / by[ref]
        checks = []
        if r["method"] == "ours default":
            checks += [
                ("<=1.15x unpatched", r.get("x_unpatched"), 1.15),
                ("<=peer C=1", r.get("x_peer1"), 1.0),
                ("<=peers at<=peak", peer_bound(r, peers), 1.0),
            ]
        if r["method"] == "ours throughput":
            if r["BT"] >= 4096:
                checks.append(("<=0.92x unpatched", r.get("x_unpatched"), 0.92))
            if r["BT"] >= 8192:
                checks.append(("<=1.10x floor", r.get("x_floor"), 1.10))
        if checks:
            r["targets"] = {
                label: (None if x is None else bool(x <= limit)) for label, x, limit in checks
            }  # None: reference row missing


def peer_bound(ours: dict, peers: list[dict]) -> float | None:
    """ours' ms over the fastest peer row whose peak is at or below ours, 0 when no peer is that lean;
    None without a peak or without any peer measured."""
    if ours.get("peak_mib") is None or not peers or any(p.get("peak_mib") is None for p in peers):
        return None
    lean = [p["random_ms"] for p in peers if p["peak_mib"] <= ours["peak_mib"]]
    return ours["random_ms"] / min(lean) if lean else 0.0


def run_group(shape, h, v, bt, args, timer, api, problems, device, dtype, methods) -> list[dict]:
    w = make_weight(h, v, device, dtype)
    data = {"random": make_hidden(bt, w, "random")}
    if args.peaked:
        data["peaked"] = make_hidden(bt, w, "peaked")
    ctx = {"shape": shape, "w": w, "api": api, "problems": problems}
    rows = {name: row_head(name, kind, kwargs, bt, ctx) for name, kind, kwargs in methods}
    start = time.perf_counter()
    measure_rows(rows, methods, data, timer, w)
    if args.repeat:
        retime(rows, methods, data["random"], w, timer)
    for row in rows.values():
        row["wall_s"] = time.perf_counter() - start  # the group's, rows are timed together
        row["ms"] = row.get("random_ms")
    print(f"  {shape} BT={bt}: {len(rows)} rows in {time.perf_counter() - start:.1f} s", flush=True)
    judge(list(rows.values()))
    del w, data, ctx
    return list(rows.values())


def retime(rows: dict, methods, xt, w, timer) -> None:
    """A second interleaved median of the compared rows after the first (A B .. A B): each keeps the smaller,
    the difference is the run's noise."""
    x, t = xt
    again = [(n, k, kw) for n, k, kw in methods if n in REPEATED and "random_ms" in rows[n]]
    fns = {name: timed_fn(kind, kwargs, x, w, t, name) for name, kind, kwargs in again}
    failed: dict[str, BaseException] = {}
    timings = timer.measure(fns, [x, w], failed)
    x.grad = w.grad = None
    if timer.cuda:
        torch.cuda.empty_cache()
    for name, exc in failed.items():
        rows[name]["repeat_error"] = f"{type(exc).__name__}: {exc}"[:200]
    for name, timing in timings.items():
        row = rows[name]
        row["random_ms_runs"] = [row["random_ms"], timing.median]
        row["random_ms"] = min(row["random_ms"], timing.median)
        row["spread"] = abs(row["random_ms_runs"][0] - timing.median) / row["random_ms"]


# --- numerics: loss, dX, dW of every method vs float64 on one small shape


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


def loss_check(shape, h, v, bt, device, dtype, api, problems, methods) -> list[dict]:
    w = make_weight(h, v, device, dtype)
    x, t = make_hidden(bt, w, "random", seed=7)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.cross_entropy(xr @ wr.t(), t)
    ref.backward()
    out = []
    for name, kind, kwargs in methods:
        if kind in ("floor",):
            continue
        row = {"shape": shape, "BT": bt, "method": name}
        problem = api_problem(kwargs, api) if kind == "ours" else problems.get(kind)
        if problem:
            row["error"] = problem
            out.append(row)
            continue
        x.grad = w.grad = None
        try:
            if kind == "unpatched":
                loss = F.cross_entropy((x @ w.t()).float(), t)
            elif kind == "peer":
                loss = peer_loss(x, w, t, kwargs["chunk_mem_const"])
            elif kind == "cce":
                loss = cce_loss(x, w, t, kwargs["impl"])
            else:
                loss = K.fused_linear_cross_entropy(x, w, t, **kwargs)
            loss.backward()
            row.update(
                loss=float(loss.detach()),
                loss_rel=abs(float(loss.detach()) - float(ref.detach())) / abs(float(ref.detach())),
                dx_rel=rel(x.grad, xr.grad),
                dw_rel=rel(w.grad, wr.grad),
            )
            if kind == "ours":
                row["loss_target_1e-5"] = row["loss_rel"] <= 1e-5
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        out.append(row)
    del w, x, xr, wr
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


# --- report


def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def verdict(r: dict) -> str:
    t = r.get("targets")
    if not t:
        return ""
    return " ".join(f"{label}:{'?' if ok is None else 'met' if ok else 'MISSED'}" for label, ok in t.items())


COLUMNS = [
    ("shape", ""),
    ("BT", "d"),
    ("method", ""),
    ("plan", ""),
    ("pred", ".1f"),
    ("ms", ".2f"),
    ("iqr", ".1%"),
    ("peaked", ".2f"),
    ("MiB", ".0f"),
    ("/unp", ".3f"),
    ("/peer1", ".3f"),
    ("/cce", ".3f"),
    ("/floor", ".3f"),
    ("targets", ""),
]
RATIOS = ("x_unpatched", "x_peer1", "x_cce", "x_floor")


def table_row(r: dict) -> list:
    if "error" in r and "random_ms" not in r:
        return [r["shape"], r["BT"], r["method"], r.get("plan_text", "")] + [None] * 9 + [r["error"][:60]]
    head = [r["shape"], r["BT"], r["method"], r.get("plan_text", ""), plan_cost(r.get("plan"))]
    head += [r.get("random_ms"), r.get("random_iqr"), r.get("peaked_ms"), r.get("peak_mib")]
    return head + [r.get(k) for k in RATIOS] + [verdict(r)]


def print_table(rows, checks, meta) -> None:
    env = meta["env"]
    title = (
        f"FLCE fwd+bwd, {meta['dtype']}, median ms (warm-up {meta['warmup_ms']:.0f} / timed {meta['rep_ms']:.0f} "
        f"ms a row, rows interleaved), incremental peak MiB; {env.get('device', 'cpu')}, torch {env['torch']}, "
        f"triton {env['triton']}, peer {env.get('liger_kernel')}, cut-cross-entropy {env.get('cut_cross_entropy')}"
    )
    spreads = [r["spread"] for r in rows if "spread" in r]
    if spreads:
        print(
            f"ms of {', '.join(REPEATED)}: best of two interleaved medians (A B .. A B); spread between the two: "
            f"median {statistics.median(spreads):.1%}, max {max(spreads):.1%}"
        )
    check_cols = [("method", ""), ("loss", ".6f"), ("loss rel", ".1e"), ("1e-5", ""), ("dX", ".2e")]
    check_cols += [("dW", ".2e"), ("error", "")]
    check_rows = [
        [c["method"], c.get("loss"), c.get("loss_rel"), c.get("loss_target_1e-5")]
        + [c.get("dx_rel"), c.get("dw_rel"), c.get("error", "")[:90]]
        for c in checks
    ]
    where = ", ".join(f"{c['shape']} BT={c['BT']}" for c in checks[:1])
    harness.print_table(check_cols, check_rows, f"loss / dX / dW vs float64 ({where})")
    harness.print_table(COLUMNS, [table_row(r) for r in rows], title)
    targets = [ok for r in rows for ok in (r.get("targets") or {}).values()]
    print(
        f"\ntargets: {sum(1 for x in targets if x)} met, {sum(1 for x in targets if x is False)} MISSED, "
        f"{sum(1 for x in targets if x is None)} not evaluable; {meta['errors']} rows with errors; "
        f"sweep {meta['wall_s']:.0f} s; json: {meta['json']}"
    )


def record(results: harness.Results, rows: list[dict]) -> None:
    for r in rows:
        case = f"{r['shape']} BT={r['BT']}"
        for key in ("random_ms", "peaked_ms", "peak_mib", *RATIOS):
            results.add(case, r["method"], key, r.get(key))


def peers_available(cuda: bool) -> dict[str, str]:
    """Why a peer's rows cannot run ({} when every peer imports)."""
    if not cuda:
        return {"peer": "peer needs CUDA", "cce": "cce needs CUDA"}
    problems = {}
    try:
        import liger_kernel.ops.fused_linear_cross_entropy  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        problems["peer"] = f"liger-kernel not importable: {exc!r}"[:200]
    try:
        import cut_cross_entropy  # noqa: F401
    except ModuleNotFoundError:
        problems["cce"] = "skipped: not installed (cut-cross-entropy)"
    except Exception as exc:  # noqa: BLE001
        problems["cce"] = f"cut-cross-entropy not importable: {exc!r}"[:200]
    return problems


ANNOUNCED = (
    "API missing",
    "peer needs CUDA",
    "liger-kernel not importable",
    "cce needs CUDA",
    "skipped: not installed",
    "cut-cross-entropy not importable",
)


def main(argv=None) -> int:
    args = parse(argv)
    if args.plan_table:
        return plan_table(args)
    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        print("flce: CUDA is not available (use --cpu-smoke to check the script on CPU)")
        return 2
    if args.strategies:
        return strategies(args)
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES if cuda else SMOKE_SHAPES
    bts = [int(b) for b in args.bt.split(",")] if args.bt else (BTS if cuda else SMOKE_BTS)
    wanted = args.methods.split(",") if args.methods else None
    methods = [m for m in METHODS if wanted is None or m[0] in wanted]
    api = probe_api()
    problems = peers_available(cuda)
    for key, why in api.items():
        if why:
            print(f"flce: {why}; rows that need {key} are skipped")
    timer = Timer(cuda, args.warmup_ms, args.rep_ms)
    start = time.perf_counter()
    rows = []
    for shape in args.shapes.split(","):
        h, v = shapes[shape]
        for bt in bts:
            rows += run_group(shape, h, v, bt, args, timer, api, problems, device, dtype, methods)
    sweep_s = time.perf_counter() - start
    small = ("llama", 2048) if cuda else ("llama", 64)
    checks = loss_check(small[0], *shapes[small[0]], small[1], device, dtype, api, problems, methods)
    results = harness.Results("flce", args.out)
    env = dict(results.env, cut_cross_entropy=harness._version("cut-cross-entropy") or "not installed")
    results.set_env(env)
    meta = {
        "dtype": str(dtype).removeprefix("torch."),
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "env": env,
        "wall_s": sweep_s,
        "errors": sum(1 for r in rows if "error" in r),
        "json": str(results.path("json")),
    }
    record(results, rows)
    results.write({"meta": meta, "args": vars(args), "api": api, "rows": rows, "loss_check": checks})
    errors = [
        f"{r['shape']} BT={r['BT']} {r['method']}: {r['error']}"
        for r in rows
        if "error" in r and not r["error"].startswith(ANNOUNCED)
    ]
    for e in errors[:20]:
        print("ERROR", e[:200])
    print_table(rows, checks, meta)
    return 0


# --- the strategy calibration (--strategies) and the planner's table (--plan-table)


def strategy_rows(shape: str, bt: int, h: int, v: int, peaks, args) -> list[dict]:
    """Each strategy the planner can run at each budget, timed together, with the cost model's ms."""
    from liger_registry.kernels.flce.cost import tokens_ms, vocab_ms

    w = make_weight(h, v, "cuda", torch.bfloat16)
    x, t = make_hidden(bt, w, "random")
    cases, fns = {}, {}
    for label, knobs in BUDGETS.items():
        auto = K.flce_plan(bt, h, v, **knobs)
        for strategy in ("tokens", "vocab"):
            plan = K.flce_plan(bt, h, v, strategy=strategy, **knobs)
            if plan.strategy != strategy:
                continue
            pred = (tokens_ms if strategy == "tokens" else vocab_ms)(bt, h, v, plan.chunk, 2, peaks)
            cases[f"{label} {strategy}"] = {
                "shape": shape,
                "bt": bt,
                "budget": label,
                "strategy": strategy,
                "predicted_ms": pred,
                "auto": auto.strategy,
                "plan": str(plan),
            }
            fns[f"{label} {strategy}"] = ours_fn(x, w, t, {"strategy": strategy, **knobs})
    timings = harness.measure(fns, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, grad_to_none=[x, w])
    for name, timing in timings.items():
        cases[name].update(
            ms=timing.median, spread=timing.spread, peak_mib=harness.peak_mib(fns[name], [x, w])
        )
    return [cases[name] for name in timings]


def strategies(args) -> int:
    from liger_registry.kernels.flce.cost import device_peaks

    peaks = device_peaks()
    results = harness.Results("flce", args.out, tag="strategies")
    rows = []
    for shape in args.shapes.split(","):
        h, v = SHAPES[shape]
        for bt in (2048, 4096) if args.quick else BTS:
            rows += strategy_rows(shape, bt, h, v, peaks, args)
            torch.cuda.empty_cache()
    for r in rows:
        case = f"{r['shape']} BT={r['bt']} {r['budget']}"
        for key in ("ms", "predicted_ms", "peak_mib"):
            results.add(case, r["strategy"], key, r[key])
    path = results.write({"peaks": str(peaks), "args": vars(args), "rows": rows})
    cols = [("shape", ""), ("BT", "d"), ("budget", ""), ("strategy", ""), ("ms", ".2f"), ("spread", ".1%")]
    cols += [("model ms", ".1f"), ("peak MiB", ".0f"), ("auto", "")]
    keys = ("shape", "bt", "budget", "strategy", "ms", "spread", "predicted_ms", "peak_mib", "auto")
    harness.print_table(cols, [[r[k] for k in keys] for r in rows], f"FLCE strategies forced; json: {path}")
    return 0


def plan_table(args) -> int:
    """The planner's choice and predicted ms per shape, BT and budget, for the device ``args.gpu``."""
    from liger_registry.kernels.flce.cost import peaks_for, tokens_ms, vocab_ms

    peaks = peaks_for(args.gpu)
    rows = []
    for shape in args.shapes.split(","):
        h, v = SHAPES[shape]
        for bt in [int(b) for b in args.bt.split(",")] if args.bt else BTS:
            for label, knobs in BUDGETS.items():
                plan = K.flce_plan(bt, h, v, gpu=args.gpu, **knobs)
                tok = K.flce_plan(bt, h, v, gpu=args.gpu, strategy="tokens", **knobs)
                voc = K.flce_plan(bt, h, v, gpu=args.gpu, strategy="vocab", **knobs)
                t_ms = tokens_ms(bt, h, v, tok.chunk_tokens, 2, peaks)
                v_ms = vocab_ms(bt, h, v, voc.chunk_vocab, 2, peaks) if voc.strategy == "vocab" else None
                layout = (
                    f"{plan.num_chunks} x [{plan.chunk_tokens}, {plan.chunk_vocab}] {plan.buffer_mib:.0f} MiB"
                )
                rows.append([f"{shape} H={h} V={v}", bt, label, t_ms, v_ms, plan.strategy, layout])
    cols = [("shape", ""), ("BT", "d"), ("budget", ""), ("tokens ms", ".1f"), ("vocab ms", ".1f")]
    cols += [("pick", ""), ("plan", "")]
    harness.print_table(cols, rows, f"FLCE planner for {args.gpu}; peaks: {peaks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
