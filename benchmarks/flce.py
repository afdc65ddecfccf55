"""FLCE benchmark: every head against its three-GEMM floor, ours against every peer, per head and tokens.

Heads: Llama-3 (H=4096, V=128256) and GPT-OSS (H=2880, V=201088); BT = 2048, 4096, 8192, 16384 tokens; bf16,
forward + backward w.r.t. hidden and weight.

The floor is three GEMMs (logits, dX, dW): ``6 N H V`` FLOPs at the dense bf16 GEMM rate measured in the same
process (one ``torch.mm`` of 8192^3; on CPU fp32 256^3). Every row gives its median ms as a multiple of that floor
(``x_floor``) and of the unpatched head (``x_unpatched``).

Methods (``rows`` of the JSON, one per head, tokens and method; ``method`` is the name):

* ``ours``: ``fused_linear_cross_entropy`` at the budget the registry resolves for the head's model type (what a
  patched model runs: C=1 for Llama-3, the GPT-OSS policy's C=8 for GPT-OSS), with the plan it ran;
* ``cce``: cut-cross-entropy's ``linear_cross_entropy`` (its default impl; a benchmark-only peer imported here
  when installed, else the row says why);
* ``liger``: liger-kernel's fused linear cross entropy at C=1 (benchmark-only peer);
* ``torch_native``: ``torch.nn.functional.linear_cross_entropy`` with ``LinearCrossEntropyOptions()`` (its
  chunked path) where the installed torch has it;
* ``unpatched``: ``F.cross_entropy((x @ W.T).float(), t)``, what a model does without a fused head.

Variants (``variants`` of the JSON, chosen with ``--methods``; ``gemms`` runs by default): ``gemms`` (the three
GEMMs of this shape as bare cuBLAS calls: how far the shape's own GEMMs are from the dense rate), ``ours C=1``,
``ours C=8``,
``ours throughput`` (max_chunk_mib=512), ``ours tokens`` / ``ours vocab`` (the strategy forced),
``ours 1-kept`` / ``ours all-kept`` (vocab layouts), ``liger C=8``, ``cce exact`` (no gradient filtering).

Inputs (``--inputs``, the first one gives ``ms``): ``confident`` (default: hidden leans on its target's weight
row so that the loss is about 2, a trained model's softmax) and ``random`` (hidden ~ N(0,1): a dense softmax,
as at initialisation; cut-cross-entropy's gradient filtering skips nothing there). Weight ~ N(0, 0.02^2).

Per row: median ms (the harness: each row warmed up, then the calls of a group's rows interleaved; the headline
rows timed twice, best of two medians), ``peak_mib`` (max_memory_allocated during one step minus what was
allocated before it: inputs and weight excluded, gradients included), ``x_floor``, ``x_unpatched``. Targets of
``ours``: <= 1.15x the floor at >= 4096 tokens, <= 1.10x where tokens <= H, no slower than any peer (cce, liger,
torch_native), peak <= 1.10x cut-cross-entropy's. A loss and gradient check against float64 runs on one small
shape. JSON and CSV under --out; the table is printed last.

Two more modes: ``--strategies`` times each FLCE strategy forced, against the planner's predicted ms (the cost
model's calibration, docs/design/flce-cost-model.md), and ``--plan-table`` prints the planner's choice and
predicted ms for the shapes without timing anything (no GPU needed; ``--gpu`` names the device's peaks).

Usage: python -m benchmarks flce [--quick] [--inputs confident,random] [--shapes llama,gpt_oss] [--bt 2048,4096]
                                 [--methods ours,cce,liger,torch_native,unpatched,gemms,ours C=8,...]
       python -m benchmarks flce --cpu-smoke     # tiny shapes on CPU: checks the script, measures nothing
       python -m benchmarks flce --strategies [--quick]
       python -m benchmarks flce --plan-table [--gpu "NVIDIA H200"]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import math
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
QUICK_BTS = (2048, 8192)  # one length with tokens <= H, one with tokens > H
SMOKE_BTS = (64, 256)
THROUGHPUT_MIB = 512
INPUTS = ("confident", "random")
# the dense GEMM that measures the floor's rate: its side on CUDA (bf16) and on CPU (fp32)
DENSE_N, SMOKE_DENSE_N = 8192, 256
# (name, kind, keyword arguments of ours / chunk_mem_const of liger / impl of cce)
METHODS = (
    ("unpatched", "unpatched", {}),
    ("ours", "ours", {}),
    ("cce", "cce", {"impl": "cce"}),
    ("liger", "liger", {"chunk_mem_const": 1}),
    ("torch_native", "torch_native", {}),
    ("gemms", "gemms", {}),
    ("ours C=1", "ours", {"chunk_mem_const": 1}),
    ("ours C=8", "ours", {"chunk_mem_const": 8}),
    ("ours throughput", "ours", {"max_chunk_mib": THROUGHPUT_MIB}),
    ("ours tokens", "ours", {"strategy": "tokens"}),
    ("ours vocab", "ours", {"strategy": "vocab"}),
    # vocab layouts for A/B, whatever the cost model chooses: only pass 1's last chunk kept (the layout before
    # kept_geometry), and every chunk kept where that applies (N <= H)
    ("ours 1-kept", "ours_layout", {"strategy": "vocab"}),
    ("ours all-kept", "ours_layout", {"strategy": "vocab"}),
    ("liger C=8", "liger", {"chunk_mem_const": 8}),
    ("cce exact", "cce", {"impl": "cce_exact"}),
)
# the JSON's `rows`: one per head, tokens and each of these methods; every other method is a variant
HEADLINE = ("ours", "cce", "liger", "torch_native", "unpatched")
DEFAULT_METHODS = (*HEADLINE, "gemms")
# the peers ours must not be slower than (their default configurations)
PEERS = ("cce", "liger", "torch_native")
# the vocab layout of each "ours_layout" row: vocab_geometry's keep
LAYOUTS = {"ours 1-kept": False, "ours all-kept": True}
PLAN_COST_FIELDS = ("predicted_ms", "cost_ms", "est_ms", "time_ms")
# the targets of ours (the floor's multiples; its peak against cut-cross-entropy's)
FLOOR_LONG, FLOOR_LONG_TOKENS, FLOOR_SHORT, PEAK_OVER_CCE = 1.15, 4096, 1.10, 1.10
# the strategy calibration (--strategies): budgets of the planner, shapes from SHAPES
BUDGETS = {"C=1": {"chunk_mem_const": 1}, "C=8": {"chunk_mem_const": 8}, "512MiB": {"max_chunk_mib": 512}}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~1 minute subset: BT 2048 and 8192 of both shapes")
    p.add_argument(
        "--inputs", default="confident", help="comma list of " + ", ".join(INPUTS) + " (first: ms)"
    )
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--bt", default=None, help="comma list of tokens per call (default 2048,4096,8192,16384)")
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help="comma list of method names, or 'all': " + ", ".join(m[0] for m in METHODS),
    )
    p.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up of each row (ms of running)")
    p.add_argument("--rep-ms", type=float, default=300.0, help="timed calls of each row (ms of running)")
    p.add_argument(
        "--no-repeat", dest="repeat", action="store_false", help="time the headline rows once, not twice"
    )
    p.add_argument(
        "--cpu-smoke", action="store_true", help="tiny fp32 shapes on CPU, wall-clock timing, no CUDA peer"
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
        args.bt = args.bt or ",".join(map(str, QUICK_BTS))
        args.warmup_ms, args.rep_ms = min(args.warmup_ms, 25.0), min(args.rep_ms, 100.0)
    unknown = [i for i in args.inputs.split(",") if i not in INPUTS]
    if unknown:
        p.error(f"unknown --inputs {', '.join(unknown)}; known: {', '.join(INPUTS)}")
    names = [m[0] for m in METHODS]
    wanted = names if args.methods == "all" else args.methods.split(",")
    unknown = [m for m in wanted if m not in names]
    if unknown:
        p.error(f"unknown --methods {', '.join(unknown)}; known: {', '.join(names)}")
    args.method_list = [m for m in METHODS if m[0] in wanted]
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


# --- data, the floor and the functions timed


def make_weight(h: int, v: int, device, dtype) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(v, h, device=device, generator=g) * 0.02).to(dtype).requires_grad_()


CONFIDENT_LOSS = 2.0


def make_hidden(bt: int, w: torch.Tensor, kind: str, seed: int = 1):
    """``(hidden, target)``: ``random`` hidden ~ N(0, 1); ``confident`` adds ``c * W[target]`` with ``c`` such
    that the target logit sits ~CONFIDENT_LOSS below the log-sum-exp of the other logits (``ln V + s / 2`` for
    logits ~ N(0, s), ``s`` the mean squared norm of a weight row): a loss of about 2, as a trained model's."""
    v, h = w.shape
    g = torch.Generator(device=w.device).manual_seed(seed)
    t = torch.randint(0, v, (bt,), device=w.device, generator=g)
    x = torch.randn(bt, h, device=w.device, generator=g)
    if kind == "confident":
        wf = w.detach().float()
        s = float(wf.pow(2).sum(-1).mean())
        c = (math.log(v) + s / 2 - CONFIDENT_LOSS) / s
        x = x + c * wf[t]
    elif kind != "random":
        raise ValueError(f"unknown inputs {kind!r}; known: {', '.join(INPUTS)}")
    return x.to(w.dtype).requires_grad_(), t


def dense_rate(cuda: bool, warmup_ms: float, rep_ms: float) -> dict:
    """The dense GEMM rate of this process's device: one square ``torch.mm`` (bf16 8192^3 on CUDA, fp32 256^3 on
    the CPU), median ms and TFLOP/s."""
    n, device, dtype = (DENSE_N, "cuda", torch.bfloat16) if cuda else (SMOKE_DENSE_N, "cpu", torch.float32)
    g = torch.Generator(device=device).manual_seed(3)
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    budget = {"warmup_ms": warmup_ms, "rep_ms": rep_ms} if cuda else {"warmup": 1, "repeats": 5}
    timing = harness.measure({"mm": lambda: torch.mm(a, b, out=out)}, cuda=cuda, **budget)["mm"]
    return {
        "n": n,
        "dtype": str(dtype).removeprefix("torch."),
        "ms": timing.median,
        "tflops": 2.0 * n**3 / (timing.median * 1e-3) / 1e12,
    }


def floor_ms(bt: int, h: int, v: int, rate: dict) -> float:
    """Three GEMMs (logits, dX, dW) of this head at the measured dense rate, ms."""
    return 6.0 * bt * h * v / (rate["tflops"] * 1e12) * 1e3


def gemms_fn(x, w):
    """The three bare GEMMs of this size: logits [BT,V], dX [BT,H], dW [V,H]; a random logits gradient."""
    xd, wd = x.detach(), w.detach()
    g = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype).normal_()
    dx, dw = torch.empty_like(xd), torch.empty_like(wd)

    def f():
        torch.mm(xd, wd.t(), out=g)
        torch.mm(g, wd, out=dx)
        torch.mm(g.t(), xd, out=dw)

    return f


def unpatched_loss(x, w, t):
    return F.cross_entropy((x @ w.t()).float(), t)


def liger_loss(x, w, t, chunk_mem_const: int):
    """The peer's FLCE loss (liger-kernel 0.8.5's positional autograd signature), mean over tokens."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    flags = (None, None, -100, 0.0, 0.0, "mean", None, False, None, False, False, False, None, None)
    out = LigerFusedLinearCrossEntropyFunction.apply(x, w, t, *flags, chunk_mem_const)
    return out[0] if isinstance(out, tuple) else out


def cce_loss(x, w, t, impl: str):
    """cut-cross-entropy's fused loss (mean over tokens); the package is a benchmark-only peer, imported here."""
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(x, w, t, impl=impl, reduction="mean")


def has_torch_native() -> bool:
    return hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")


def torch_native_loss(x, w, t):
    """torch's own fused head (its chunked path: options given, every choice left to ``auto``)."""
    return F.linear_cross_entropy(x, w, t, options=torch.nn.LinearCrossEntropyOptions())


def ours_loss(x, w, t, kwargs: dict):
    return K.fused_linear_cross_entropy(x, w, t, **kwargs)


def loss_of(kind: str, kwargs: dict, x, w, t):
    """The loss of one method (not the bare GEMMs)."""
    if kind == "unpatched":
        return unpatched_loss(x, w, t)
    if kind == "liger":
        return liger_loss(x, w, t, kwargs["chunk_mem_const"])
    if kind == "cce":
        return cce_loss(x, w, t, kwargs["impl"])
    if kind == "torch_native":
        return torch_native_loss(x, w, t)
    return ours_loss(x, w, t, kwargs)


def ours_layout_fn(x, w, t, kwargs: dict, keep: bool):
    """ours with the vocab layout ``keep`` instead of the cost model's: False keeps only pass 1's last chunk,
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
    """One forward + backward of the method (the bare GEMMs for ``gemms``)."""
    if kind == "gemms":
        return gemms_fn(x, w)
    if kind == "ours_layout":
        return ours_layout_fn(x, w, t, kwargs, LAYOUTS[name])
    return lambda: loss_of(kind, kwargs, x, w, t).backward()


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


# --- one (head, tokens) group of rows


def row_head(name, kind, kwargs, bt, ctx) -> dict:
    """A row's identity and plan; "error" when the installed kernels or peers cannot run it."""
    w = ctx["w"]
    h, v = w.shape[1], w.shape[0]
    row = {"head": ctx["shape"], "tokens": bt, "method": name, "kind": kind, "H": h, "V": v, "kwargs": kwargs}
    if kind == "ours":
        row["plan"], row["plan_text"] = plan_of(bt, h, v, kwargs, w.dtype, ctx["api"])
    elif kind == "ours_layout":
        row["plan_text"] = "vocab, all kept" if LAYOUTS[name] else "vocab, 1 kept"
    elif kind == "liger":
        chunk, n = K.flce_chunk_geometry(bt, h, v, kwargs["chunk_mem_const"])
        row["plan_text"] = f"tokens {chunk}x{n}"
    elif kind == "cce":
        row["plan_text"] = f"impl {kwargs['impl']}"
    skip = api_problem(kwargs, ctx["api"]) if kind in ("ours", "ours_layout") else ctx["problems"].get(kind)
    if skip:
        row["error"] = skip
    return row


def measure_rows(rows, methods, data, timer, w) -> None:
    """Every runnable row of the group timed together (interleaved) per input kind; the peak of each apart, on
    the first inputs."""
    live = [(n, k, kw) for n, k, kw in methods if "error" not in rows[n]]
    for i, (label, (xx, tt)) in enumerate(data.items()):
        fns = {name: timed_fn(kind, kwargs, xx, w, tt, name) for name, kind, kwargs in live}
        failed: dict[str, BaseException] = {}
        timings = timer.measure(fns, [xx, w], failed)
        for name, timing in timings.items():
            rows[name][f"{label}_ms"] = timing.median
            rows[name][f"{label}_iqr"] = timing.spread
        for name, exc in failed.items():
            rows[name]["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if i == 0:
            for name, kind, _ in live:
                if name in timings and kind != "gemms":
                    rows[name]["peak_mib"] = timer.peak_mib(fns[name], [xx, w])
        xx.grad = w.grad = None
        del fns
        gc.collect()
        if timer.cuda:
            torch.cuda.empty_cache()


def retime(rows: dict, methods, label: str, xt, w, timer) -> None:
    """A second interleaved median of the headline rows after the first (A B .. A B): each keeps the smaller,
    the difference is the run's noise."""
    x, t = xt
    key = f"{label}_ms"
    again = [(n, k, kw) for n, k, kw in methods if n in HEADLINE and key in rows[n]]
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
        row[f"{key}_runs"] = [row[key], timing.median]
        row[key] = min(row[key], timing.median)
        row["spread"] = abs(row[f"{key}_runs"][0] - timing.median) / row[key]


def judge(rows: list[dict], floor: float) -> None:
    """Every measured row as a multiple of the floor and of the unpatched head; the targets of ``ours``."""
    by = {r["method"]: r for r in rows}
    unpatched = by.get("unpatched", {}).get("ms")
    for r in rows:
        r["floor_ms"] = floor
        if r.get("ms") is None:
            continue
        r["x_floor"] = r["ms"] / floor
        r["x_unpatched"] = r["ms"] / unpatched if unpatched else None
    ours = by.get("ours")
    if ours is not None and ours.get("ms") is not None:
        ours["targets"] = targets_of(ours, [by[p] for p in PEERS if p in by])


def targets_of(ours: dict, peers: list[dict]) -> dict[str, bool | None]:
    """The targets of ours (None: the reference row is missing)."""
    out: dict[str, bool | None] = {}
    if ours["tokens"] >= FLOOR_LONG_TOKENS:
        out[f"<={FLOOR_LONG:.2f}x floor"] = ours["x_floor"] <= FLOOR_LONG
    if ours["tokens"] <= ours["H"]:
        out[f"<={FLOOR_SHORT:.2f}x floor"] = ours["x_floor"] <= FLOOR_SHORT
    timed = [p["ms"] for p in peers if p.get("ms") is not None]
    out["<=every peer"] = ours["ms"] <= min(timed) if timed else None
    cce = next((p for p in peers if p["method"] == "cce"), {})
    both = ours.get("peak_mib") is not None and cce.get("peak_mib") is not None
    out[f"peak<={PEAK_OVER_CCE:.2f}x cce"] = (
        ours["peak_mib"] <= PEAK_OVER_CCE * cce["peak_mib"] if both else None
    )
    for p in peers:
        if p.get("ms") is not None:
            ours[f"x_{p['method']}"] = ours["ms"] / p["ms"]
    return out


@functools.cache
def head_budget(shape: str) -> dict:
    """The FLCE budget the registry resolves for the head's model type (its family entry and bundled policies:
    GPT-OSS C=8), as keyword arguments of ours; {} (the default budget) when the registry cannot say."""
    try:
        from liger_registry import explain

        resolved = explain(shape)
        knobs = {k: resolved.value(f"flce.{k}") for k in ("chunk_mem_const", "max_chunk_mib")}
    except Exception:  # noqa: BLE001 - a head without a registry entry runs the default budget
        return {}
    return {k: v for k, v in knobs.items() if v is not None}


def run_group(shape, h, v, bt, args, timer, api, problems, device, dtype, rate) -> list[dict]:
    budget = head_budget(shape)
    methods = [(n, k, budget if n == "ours" else kw) for n, k, kw in args.method_list]
    w = make_weight(h, v, device, dtype)
    data = {kind: make_hidden(bt, w, kind) for kind in args.inputs.split(",")}
    ctx = {"shape": shape, "w": w, "api": api, "problems": problems}
    rows = {name: row_head(name, kind, kwargs, bt, ctx) for name, kind, kwargs in methods}
    start = time.perf_counter()
    measure_rows(rows, methods, data, timer, w)
    first = next(iter(data))
    if args.repeat:
        retime(rows, methods, first, data[first], w, timer)
    for row in rows.values():
        row["wall_s"] = time.perf_counter() - start  # the group's, rows are timed together
        row["inputs"] = first
        row["ms"] = row.get(f"{first}_ms")
    print(f"  {shape} BT={bt}: {len(rows)} rows in {time.perf_counter() - start:.1f} s", flush=True)
    judge(list(rows.values()), floor_ms(bt, h, v, rate))
    del w, data, ctx
    return list(rows.values())


# --- numerics: loss, dX, dW of every method vs float64 on one small shape


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


def loss_check(shape, h, v, bt, inputs, device, dtype, api, problems, methods) -> list[dict]:
    w = make_weight(h, v, device, dtype)
    x, t = make_hidden(bt, w, inputs, seed=7)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.cross_entropy(xr @ wr.t(), t)
    ref.backward()
    out = []
    for name, kind, kwargs in methods:
        if kind in ("gemms", "ours_layout"):
            continue
        row = {"head": shape, "tokens": bt, "inputs": inputs, "method": name}
        problem = api_problem(kwargs, api) if kind == "ours" else problems.get(kind)
        if problem:
            row["error"] = problem
            out.append(row)
            continue
        x.grad = w.grad = None
        try:
            loss = loss_of(kind, kwargs, x, w, t)
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


def verdict(r: dict) -> str:
    t = r.get("targets")
    if not t:
        return ""
    return " ".join(f"{label}:{'?' if ok is None else 'met' if ok else 'MISSED'}" for label, ok in t.items())


def columns(extra_inputs: list[str]) -> list[tuple[str, str]]:
    cols = [("head", ""), ("tokens", "d"), ("method", ""), ("plan", ""), ("pred", ".1f"), ("ms", ".2f")]
    cols += [("iqr", ".1%")] + [(f"{i} ms", ".2f") for i in extra_inputs]
    return cols + [("MiB", ".0f"), ("x floor", ".3f"), ("x unp", ".3f"), ("targets", "")]


def table_row(r: dict, extra_inputs: list[str]) -> list:
    first = r.get("inputs", "")
    if "error" in r and r.get("ms") is None:
        return (
            [r["head"], r["tokens"], r["method"], r.get("plan_text", "")]
            + [None] * (6 + len(extra_inputs))
            + [r["error"][:60]]
        )
    head = [r["head"], r["tokens"], r["method"], r.get("plan_text", ""), plan_cost(r.get("plan"))]
    head += [r.get("ms"), r.get(f"{first}_iqr")] + [r.get(f"{i}_ms") for i in extra_inputs]
    return head + [r.get("peak_mib"), r.get("x_floor"), r.get("x_unpatched"), verdict(r)]


def print_table(rows, checks, meta) -> None:
    env, rate = meta["env"], meta["dense"]
    inputs = meta["inputs"]
    title = (
        f"FLCE fwd+bwd, {meta['dtype']}, {inputs[0]} inputs, median ms (warm-up {meta['warmup_ms']:.0f} / timed "
        f"{meta['rep_ms']:.0f} ms a row, rows interleaved), incremental peak MiB; floor = 6 N H V FLOPs at "
        f"{rate['tflops']:.4g} TFLOP/s ({rate['dtype']} mm {rate['n']}^3 here); {env.get('device', 'cpu')}, "
        f"torch {env['torch']}, triton {env['triton']}, liger-kernel {env.get('liger_kernel')}, "
        f"cut-cross-entropy {env.get('cut_cross_entropy')}"
    )
    spreads = [r["spread"] for r in rows if "spread" in r]
    if spreads:
        print(
            f"ms of {', '.join(HEADLINE)}: best of two interleaved medians (A B .. A B); spread between the two: "
            f"median {statistics.median(spreads):.1%}, max {max(spreads):.1%}"
        )
    check_cols = [("method", ""), ("loss", ".6f"), ("loss rel", ".1e"), ("1e-5", ""), ("dX", ".2e")]
    check_cols += [("dW", ".2e"), ("error", "")]
    check_rows = [
        [c["method"], c.get("loss"), c.get("loss_rel"), c.get("loss_target_1e-5")]
        + [c.get("dx_rel"), c.get("dw_rel"), c.get("error", "")[:90]]
        for c in checks
    ]
    where = ", ".join(f"{c['head']} BT={c['tokens']}, {c['inputs']} inputs" for c in checks[:1])
    harness.print_table(check_cols, check_rows, f"loss / dX / dW vs float64 ({where})")
    extra = list(inputs[1:])
    harness.print_table(columns(extra), [table_row(r, extra) for r in rows], title)
    targets = [ok for r in rows for ok in (r.get("targets") or {}).values()]
    print(
        f"\ntargets: {sum(1 for x in targets if x)} met, {sum(1 for x in targets if x is False)} MISSED, "
        f"{sum(1 for x in targets if x is None)} not evaluable; {meta['errors']} rows with errors; "
        f"sweep {meta['wall_s']:.0f} s; json: {meta['json']}"
    )


def record(results: harness.Results, rows: list[dict], inputs: list[str]) -> None:
    for r in rows:
        case = f"{r['head']} BT={r['tokens']}"
        for key in ("ms", *(f"{i}_ms" for i in inputs[1:]), "peak_mib", "x_floor", "x_unpatched"):
            results.add(case, r["method"], key, r.get(key))


def peers_available(cuda: bool) -> dict[str, str]:
    """Why a peer's rows cannot run ({} when every peer imports), by row kind."""
    problems = {}
    if not has_torch_native():
        problems["torch_native"] = f"skipped: torch {torch.__version__} has no F.linear_cross_entropy"
    if not cuda:
        return {**problems, "liger": "liger needs CUDA", "cce": "cce needs CUDA"}
    try:
        import liger_kernel.ops.fused_linear_cross_entropy  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        problems["liger"] = f"liger-kernel not importable: {exc!r}"[:200]
    try:
        import cut_cross_entropy  # noqa: F401
    except ModuleNotFoundError:
        problems["cce"] = "skipped: not installed (cut-cross-entropy)"
    except Exception as exc:  # noqa: BLE001
        problems["cce"] = f"cut-cross-entropy not importable: {exc!r}"[:200]
    return problems


ANNOUNCED = (
    "API missing",
    "liger needs CUDA",
    "liger-kernel not importable",
    "cce needs CUDA",
    "skipped: ",
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
    inputs = args.inputs.split(",")
    api = probe_api()
    problems = peers_available(cuda)
    for key, why in api.items():
        if why:
            print(f"flce: {why}; rows that need {key} are skipped")
    results = harness.Results("flce", args.out)
    env = dict(results.env, cut_cross_entropy=harness._version("cut-cross-entropy") or "not installed")
    results.set_env(env)
    timer = Timer(cuda, args.warmup_ms, args.rep_ms)
    start = time.perf_counter()
    rate = dense_rate(cuda, args.warmup_ms, args.rep_ms)
    print(
        f"flce: dense {rate['dtype']} GEMM {rate['n']}^3: {rate['ms']:.3f} ms, {rate['tflops']:.4g} TFLOP/s"
    )
    meta = {
        "dtype": str(dtype).removeprefix("torch."),
        "inputs": inputs,
        "dense": rate,
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "env": env,
        "json": str(results.path("json")),
    }
    rows: list[dict] = []
    for shape in args.shapes.split(","):
        h, v = shapes[shape]
        for bt in bts:
            rows += run_group(shape, h, v, bt, args, timer, api, problems, device, dtype, rate)
            write_partial(results, payload(args, api, meta, rows, None))
    meta["wall_s"] = time.perf_counter() - start
    meta["errors"] = sum(1 for r in rows if "error" in r)
    small = ("llama", 2048) if cuda else ("llama", 64)
    checks = loss_check(
        small[0], *shapes[small[0]], small[1], inputs[0], device, dtype, api, problems, args.method_list
    )
    record(results, rows, inputs)
    results.write(payload(args, api, meta, rows, checks))
    errors = [
        f"{r['head']} BT={r['tokens']} {r['method']}: {r['error']}"
        for r in rows
        if "error" in r and not r["error"].startswith(ANNOUNCED)
    ]
    for e in errors[:20]:
        print("ERROR", e[:200])
    print_table(rows, checks, meta)
    return 0


def payload(args, api, meta, rows: list[dict], checks: list[dict] | None) -> dict:
    """The result file's content: ``rows`` (the headline methods), ``variants`` (the others), the loss check
    (None: the sweep is not finished)."""
    return {
        "meta": meta,
        "args": {k: v for k, v in vars(args).items() if k != "method_list"},
        "api": api,
        "rows": [r for r in rows if r["method"] in HEADLINE],
        "variants": [r for r in rows if r["method"] not in HEADLINE],
        "loss_check": checks,
    }


def write_partial(results: harness.Results, content: dict) -> None:
    """The JSON of the groups finished so far (no CSV rows): a sweep stopped by its time limit keeps them."""
    results.path("json").write_text(json.dumps({"env": results.env, **content}, indent=1, default=str))


# --- the strategy calibration (--strategies) and the planner's table (--plan-table)


def strategy_rows(shape: str, bt: int, h: int, v: int, peaks, args) -> list[dict]:
    """Each strategy the planner can run at each budget, timed together, with the cost model's ms."""
    from liger_registry.kernels.flce.plan import tokens_ms, vocab_ms

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
            fns[f"{label} {strategy}"] = timed_fn("ours", {"strategy": strategy, **knobs}, x, w, t)
    timings = harness.measure(fns, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, grad_to_none=[x, w])
    for name, timing in timings.items():
        cases[name].update(
            ms=timing.median, spread=timing.spread, peak_mib=harness.peak_mib(fns[name], [x, w])
        )
    return [cases[name] for name in timings]


def strategies(args) -> int:
    from liger_registry.kernels.flce.plan import device_peaks

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
    from liger_registry.kernels.flce.plan import peaks_for, tokens_ms, vocab_ms

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
                cost = [getattr(plan, k, None) for k in ("gemms", "held_mib", "peak_mib")]
                rows.append([f"{shape} H={h} V={v}", bt, label, t_ms, v_ms, plan.strategy, *cost, layout])
    cols = [("shape", ""), ("BT", "d"), ("budget", ""), ("tokens ms", ".1f"), ("vocab ms", ".1f")]
    cols += [("pick", ""), ("GEMMs", ".2f"), ("held MiB", ".0f"), ("peak MiB", ".0f"), ("plan", "")]
    harness.print_table(cols, rows, f"FLCE planner for {args.gpu}; peaks: {peaks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
