"""MoE experts benchmark (GPU): the experts module alone, forward + backward, bf16; every transformers
`experts_implementation` vs liger-kernel's LigerExperts vs ours (liger_registry.modules.moe.experts_forward).

Shapes (each at 4096 and 16384 tokens, --tokens): Qwen3-30B-A3B (128 experts, top-8, hidden 2048, expert
intermediate 768, SiLU), Mixtral-8x7B (8 experts, top-2, hidden 4096, intermediate 14336, SiLU) and GPT-OSS-20B
(32 experts, top-4, hidden 2880, intermediate 2880, clamped SwiGLU over interleaved gate/up pairs, biases,
transposed [E, in, out] weights) and DBRX-132B (16 experts, top-4, hidden 6144, intermediate 10752, SiLU; its
own experts loop, gate/up/down as 2-D per-expert parameters, no experts_implementation). Each shape's transformers
experts module (Qwen3MoeExperts, MixtralExperts, GptOssExperts, DbrxExperts) is built from its config class,
bf16 on the GPU, weights ~ N(0, 0.02^2) with a fixed seed; the
routing is random: router logits ~ N(0, 1) -> the family's own softmax / top-k / renormalisation (Qwen3:
softmax, top-k, renormalised (norm_topk_prob), weights cast to bf16; Mixtral: the same, weights kept fp32;
GPT-OSS: top-k of the logits, softmax over the k; DBRX: softmax and top-k in bf16, L1-renormalised). One module per shape serves every method (same weights).

Methods: `hf:<name>` for "eager" and each key of transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS
(module.config._experts_implementation = name; one that raises, e.g. deepgemm / sonicmoe without their hub
kernels, or batched_mm out of memory, is skipped with the reason printed); `liger`: liger-kernel's LigerExperts
(liger_kernel/transformers/swiglu.py; apply_liger_kernel_to_qwen3_moe / _mixtral bind LigerExperts.forward onto
each experts module through _patch_swiglu_module; here LigerExperts.forward is called on the transformers
module, the same thing; a benchmark-only peer, imported here only; it has no GPT-OSS experts kernel); `ours`:
experts_forward(module, hidden_states, top_k_index, top_k_weights), with gate="clamped_swiglu" for GPT-OSS (what
its registry entry installs; skipped with the ImportError while absent).

Per shape x tokens x method: median ms of fwd+bwd (the harness: every method and the dense GEMMs warmed up
--warmup steps, then --iters timed steps each, interleaved; gradients of hidden_states, routing weights and every expert parameter), TFLOP/s counting
3 * 2 * T*K * (H*2I + I*H), peak MiB above the inputs (max_memory_allocated during one step minus what was
allocated before it; parameter gradients included), and the largest relative difference (max|x - ref| / max|ref|
over output and every gradient) against the reference, transformers' "eager" in bf16 (grouped_mm if eager
fails). The same FLOPs as dense bf16 GEMMs ([T*K, H] x [H, 2I] and [T*K, I] x [I, H], fwd+bwd) are timed in the
same run. Ratios (time, lower is better for ours): ours / fastest transformers implementation, ours / liger,
ours / dense. Ours' first call runs with an empty tile cache (its directory a new temporary one):
``autotune_s``, the tile searches' seconds in that call, and ``first_call_s``, its wall time; then once more
with the picks forgotten but the cache file kept (what a later process pays): ``first_call_cached_s``. The
JSON's ``rows`` list one entry per shape, tokens and method (``ours``, ``liger``, ``hf:<impl>``, ``dense``) with
ms, peak_mib, x_dense, ours_over (ours' ms over the method's) and, for ours, autotune_s and
first_call_cached_s; ``cases`` holds each shape and tokens with its methods nested. JSON under --out
(``bench_moe_<device>_<date>.json``); the table is printed last.

``--llama4``: Llama 4's MoE block instead (transformers' Llama4TextMoe, every
expert on every token, against the llama4 entry's moe_experts forward), with --tokens, --experts, --top-k.

Usage: python -m benchmarks moe [--shapes qwen3_moe,mixtral,gpt_oss,dbrx] [--tokens 4096,16384]
                                [--methods hf:eager,hf:grouped_mm,liger,ours] [--warmup 5] [--iters 20]
       python -m benchmarks moe --cpu-smoke    # tiny dims, fp32, CPU, 1 iteration: checks the script
       python -m benchmarks moe --llama4 [--tokens 4096,16384] [--experts 16] [--top-k 1] [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import inspect
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

import torch

from benchmarks import harness

# transformers' hub kernels (deepgemm, sonicmoe) must fail at once where the Hub cannot be reached
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPES = {
    "qwen3_moe": dict(
        label="Qwen3-30B-A3B",
        module="transformers.models.qwen3_moe.modeling_qwen3_moe",
        config="Qwen3MoeConfig",
        experts="Qwen3MoeExperts",
        dims=dict(
            hidden_size=2048,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            hidden_act="silu",
        ),
        smoke=dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    ),
    "mixtral": dict(
        label="Mixtral-8x7B",
        module="transformers.models.mixtral.modeling_mixtral",
        config="MixtralConfig",
        experts="MixtralExperts",
        dims=dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_local_experts=8,
            num_experts_per_tok=2,
            hidden_act="silu",
        ),
        smoke=dict(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
    ),
    "gpt_oss": dict(
        label="GPT-OSS-20B",
        module="transformers.models.gpt_oss.modeling_gpt_oss",
        config="GptOssConfig",
        experts="GptOssExperts",
        dims=dict(hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4),
        smoke=dict(hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
        gate="clamped_swiglu",  # ours: the gate the family's registry entry names (default swiglu)
    ),
    "dbrx": dict(
        label="DBRX-132B",
        module="transformers.models.dbrx.modeling_dbrx",
        config="DbrxFFNConfig",
        experts="DbrxExperts",
        dims=dict(hidden_size=6144, ffn_hidden_size=10752, moe_num_experts=16, moe_top_k=4),
        smoke=dict(hidden_size=64, ffn_hidden_size=96, moe_num_experts=4, moe_top_k=2),
        # ours: the options dbrx.yaml gives moe_experts (2-D w1/v1/w2 of its mlp, w2 stored [in, out])
        layout=dict(
            gate_up="w1",
            up="v1",
            down="w2",
            down_layout="in_out",
            weights_of="mlp",
            act_fn="activation_fn",
            output="batch_first",
        ),
    ),
}
REFERENCES = ("hf:eager", "hf:grouped_mm")  # the first of these that runs is the correctness reference
SKIP_ERRORS = ("ImportError", "ModuleNotFoundError", "OutOfMemoryError", "NotImplementedError", "Skip")


class Skip(Exception):
    """A method that does not apply to this shape (the reason is the message)."""


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", default="4096,16384")
    p.add_argument("--llama4", action="store_true", help="Llama 4's MoE block (Llama4TextMoe) instead")
    p.add_argument("--experts", type=int, default=16, help="--llama4: experts")
    p.add_argument("--top-k", type=int, default=1, help="--llama4: experts per token")
    p.add_argument(
        "--methods",
        default="all",
        help="comma list (hf:eager, hf:grouped_mm, ..., liger, ours, ours:bmN: N rows per block, "
        "ours:persistent: the rows kernel's persistent schedule)",
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tag", default="", help="result file bench_moe-<tag>_<device>_<date>.json (runs split over calls)"
    )
    p.add_argument("--cpu-smoke", action="store_true", help="tiny dims, fp32, CPU, 1 iteration")
    harness.add_out_arg(p)
    args = p.parse_args(argv)
    if args.cpu_smoke and not args.llama4:
        if args.tokens == "4096,16384":
            args.tokens = "64"
        args.warmup, args.iters = 0, 1
    return args


# --- the module, the inputs, the routing


def experts_module(shape: str, smoke: bool, device: str, dtype: torch.dtype, seed: int):
    """The family's transformers experts module, built from its config class, weights ~ N(0, 0.02^2)."""
    spec = SHAPES[shape]
    modeling = importlib.import_module(spec["module"])
    dims = {**spec["dims"], **(spec["smoke"] if smoke else {})}
    configs = importlib.import_module(spec["module"].replace(".modeling_", ".configuration_"))
    config = getattr(configs, spec["config"])(**dims)
    torch.manual_seed(seed)
    with torch.device(device):
        module = getattr(modeling, spec["experts"])(config).to(dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02)
    return module.train(), config


def _first(config, *names: str):
    return next(getattr(config, n) for n in names if getattr(config, n, None) is not None)


def dims_of(config) -> tuple[int, int, int, int]:
    """(experts E, top-k K, hidden H, expert intermediate I)."""
    e = _first(config, "num_experts", "num_local_experts", "moe_num_experts")
    inter = _first(config, "moe_intermediate_size", "intermediate_size", "ffn_hidden_size")
    return e, _first(config, "num_experts_per_tok", "moe_top_k"), config.hidden_size, inter


def route(shape: str, logits: torch.Tensor, k: int, norm_topk_prob: bool):
    """top_k_index, top_k_weights as the family's router makes them from its logits."""
    if shape == "gpt_oss":  # GptOssTopKRouter: top-k of the logits, softmax over the k, in the logits' dtype
        top, idx = torch.topk(logits, k, dim=-1)
        return idx, torch.softmax(top, dim=1, dtype=top.dtype)
    if (
        shape == "dbrx"
    ):  # DbrxFFN.route_tokens_to_experts: softmax and top-k in the logits' dtype, L1-normalised
        top, idx = torch.topk(torch.softmax(logits, dim=1, dtype=logits.dtype), k, dim=-1)
        return idx, top / torch.norm(top, p=1.0, dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, idx = torch.topk(probs, k, dim=-1)
    if shape == "mixtral" or norm_topk_prob:  # MixtralTopKRouter always renormalises and keeps fp32
        top = top / top.sum(dim=-1, keepdim=True)
    return idx, top if shape == "mixtral" else top.to(logits.dtype)


def inputs(shape: str, config, tokens: int, device: str, dtype: torch.dtype, seed: int) -> dict:
    e, k, h, _ = dims_of(config)
    torch.manual_seed(seed + 1)
    x = torch.randn(tokens, h, device=device, dtype=dtype).requires_grad_()
    logits = torch.randn(tokens, e, device=device, dtype=dtype)
    idx, weights = route(shape, logits, k, bool(getattr(config, "norm_topk_prob", False)))
    dy = torch.randn(tokens, h, device=device, dtype=dtype)
    return dict(x=x, idx=idx, w=weights.detach().requires_grad_(), dy=dy)


# --- the methods: each a function (module, hidden_states, top_k_index, top_k_weights) -> output


def transformers_impls() -> tuple[list[str], list[str]]:
    """("eager" and the installed transformers' experts implementations, notes on keys left out)."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as exc:
        return ["eager"], [f"transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS unavailable: {exc}"]
    names, notes = ["eager"], []
    for name in ALL_EXPERTS_FUNCTIONS.keys():
        owner = getattr(ALL_EXPERTS_FUNCTIONS[name], "__module__", "") or ""
        if owner.startswith("transformers."):
            names.append(name)
        else:  # registered by someone else (ours, a peer): not a transformers implementation
            notes.append(f"experts implementation {name!r} from {owner} left out (not transformers')")
    # the reference runs first; the rest in the interface's order
    return sorted(names, key=lambda n: (n != "eager", n != "grouped_mm")), notes


def hf_method(name: str):
    def fn(module, x, idx, w):
        config = getattr(module, "config", None)
        if config is None and name != "eager":  # DbrxExperts: its own loop, no experts implementations
            raise Skip(f"{type(module).__name__} has no experts_implementation {name!r}")
        if config is not None:
            config._experts_implementation = name
        return module(x, idx, w).reshape(x.shape)

    return fn


def liger_method(module, shape: str):
    """LigerExperts.forward run on the transformers module: what liger's apply_liger_kernel_to_* installs."""
    if shape == "dbrx":
        raise Skip("no liger-kernel experts kernel for DBRX (apply_liger_kernel_to_* has no dbrx)")
    if getattr(module, "has_bias", False) or getattr(module, "is_transposed", False) or shape == "gpt_oss":
        raise Skip(
            "no liger-kernel experts kernel for biases / transposed weights / clamped SwiGLU "
            "(LigerExperts: [E, 2I, H], [E, H, I], SiLU; apply_liger_kernel_to_gpt_oss keeps HF's experts)"
        )
    act = getattr(module.config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise Skip(f"LigerExperts supports silu/swish, not {act!r}")
    if next(module.parameters()).device.type != "cuda":
        raise Skip("LigerExperts' fused MoE is Triton on CUDA only")
    from liger_kernel.transformers.swiglu import LigerExperts

    def fn(module, x, idx, w):
        return LigerExperts.forward(module, x, idx, w)

    return fn


def forced_block_rows(block_m: int | None):
    """Every routing table built inside gets ``block_m`` rows per block (None: the library's choice)."""
    from liger_registry.kernels.moe import routing

    if block_m is None:
        return contextlib.nullcontext()
    return mock.patch.object(routing, "block_rows", lambda n_rows, n_experts: block_m)


def persistent_schedule(on: bool):
    """The rows kernel's persistent schedule on (``ours:persistent``) for the calls inside."""
    from liger_registry.kernels.moe import tuning

    return mock.patch.object(tuning, "PERSISTENT", on) if on else contextlib.nullcontext()


def ours_method(shape: str | None = None, block_m: int | None = None, persistent: bool = False):
    """experts_forward(module, hidden_states, top_k_index, top_k_weights[, gate=the family's gate]); ``block_m``
    (method ``ours:bmN``): the routing's rows per block forced to N, to compare with the library's choice;
    ``persistent`` (``ours:persistent``): the rows kernel's persistent schedule (off by default until measured)."""
    from liger_registry.modules.moe import experts_forward

    spec = SHAPES[shape] if shape else {}
    options = {**({"gate": spec["gate"]} if "gate" in spec else {}), **spec.get("layout", {})}
    missing = set(options) - set(inspect.signature(experts_forward).parameters)
    if missing:
        raise Skip(f"experts_forward takes no {', '.join(sorted(missing))}: cannot run this shape's layout")

    def fn(module, x, idx, w):
        with forced_block_rows(block_m):
            return experts_forward(module, x, idx, w, **options).reshape(x.shape)

    # the schedule holds for the whole step: the backward's launches run after fn returns
    fn.context = lambda: persistent_schedule(persistent)

    return fn


def autotune_picks() -> dict[str, str]:
    """Our MoE kernels' tile picks so far, ``kernel(bucket) -> config``: two runs whose times differ may differ in
    these (the bucket holds the routed rows' power-of-two bucket: one pick per token count's bucket)."""
    try:
        from liger_registry.kernels.moe import tuning
    except ImportError:
        return {}
    return tuning.picks()


@contextlib.contextmanager
def fresh_tune_cache():
    """Our tuners with no pick in this process and an empty disk cache (a new temporary directory): the first
    call searches as a user's first call on a new machine does. Yields the directory."""
    from liger_registry.kernels.moe import tune_cache, tuning

    old = os.environ.get(tune_cache.CACHE_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="moe-tune-") as tmp:
        os.environ[tune_cache.CACHE_DIR_ENV] = tmp
        tuning.reset()
        try:
            yield Path(tmp)
        finally:
            if old is None:
                os.environ.pop(tune_cache.CACHE_DIR_ENV, None)
            else:
                os.environ[tune_cache.CACHE_DIR_ENV] = old


def search_seconds() -> float:
    try:
        from liger_registry.kernels.moe import tuning
    except ImportError:
        return 0.0
    return tuning.search_seconds()


def method_fns(module, shape: str, names: list[str]) -> dict:
    """name -> fn, or name -> Exception when it cannot be built here."""
    out = {}
    for name in names:
        try:
            if name.startswith("hf:"):
                out[name] = hf_method(name[3:])
            elif name == "liger":
                out[name] = liger_method(module, shape)
            elif name == "ours":
                out[name] = ours_method(shape)
            elif name == "ours:persistent":
                out[name] = ours_method(shape, persistent=True)
            elif name.startswith("ours:bm") and (n := name.removeprefix("ours:bm")).isdigit():
                out[name] = ours_method(shape, block_m=int(n))
            else:
                raise Skip(f"unknown method {name!r}")
        except Exception as exc:  # noqa: BLE001 - an absent peer / ours is a skipped row
            out[name] = exc
    return out


# --- measuring


def leaves(module, inp: dict) -> list[torch.Tensor]:
    return [inp["x"], inp["w"], *module.parameters()]


def step(fn, module, inp: dict) -> torch.Tensor:
    """One forward and backward, under the method's ``context`` when it has one."""
    with getattr(fn, "context", contextlib.nullcontext)():
        out = fn(module, inp["x"], inp["idx"], inp["w"])
        out.backward(inp["dy"])
    return out


def results(fn, module, inp: dict) -> dict[str, torch.Tensor]:
    """The output and every gradient of one step, detached copies."""
    grads = leaves(module, inp)
    for t in grads:
        t.grad = None
    out = step(fn, module, inp)
    names = ["out", "d_hidden", "d_weights"] + [f"d_{n}" for n, _ in module.named_parameters()]
    vals = [out, *(t.grad for t in grads)]
    res = {n: v.detach().clone() for n, v in zip(names, vals, strict=True) if v is not None}
    for t in grads:
        t.grad = None
    return res


def rel_diffs(got: dict, ref: dict) -> dict[str, float]:
    diffs = {}
    for name, r in ref.items():
        if name not in got:
            diffs[name] = float("inf")
            continue
        r32, g32 = r.float(), got[name].float()
        scale = r32.abs().max().item() or 1.0
        diffs[name] = (g32 - r32).abs().max().item() / scale
    return diffs


def dense_fn(tk: int, h: int, inter: int, device: str, dtype):
    """The same FLOPs as dense GEMMs: [TK, H] x [H, 2I] and [TK, I] x [I, H], forward and backward;
    (the step, the tensors whose gradients it makes)."""
    mk = lambda *s: torch.randn(*s, device=device, dtype=dtype).requires_grad_()  # noqa: E731
    a, w1, b, w2 = mk(tk, h), mk(h, 2 * inter), mk(tk, inter), mk(inter, h)
    dy1 = torch.randn(tk, 2 * inter, device=device, dtype=dtype)
    dy2 = torch.randn(tk, h, device=device, dtype=dtype)

    def run():
        torch.mm(a, w1).backward(dy1)
        torch.mm(b, w2).backward(dy2)

    return run, [a, w1, b, w2]


def free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]


def timed_first_call(fn, module, inp, cuda) -> tuple[float, dict]:
    start = time.perf_counter()
    got = results(fn, module, inp)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, got


def check(fn, module, inp, ref, cuda, ours: bool = False) -> tuple[dict, dict]:
    """The method's first step (autotuning included): its time, peak, output and gradients against ref. Ours:
    with an empty tile cache (``autotune_s``: the tuners' search seconds in that call), then once more as a new
    process would make it with the cache filled (``first_call_cached_s``)."""
    row: dict = {}
    if ours:
        from liger_registry.kernels.moe import tuning

        with fresh_tune_cache():
            searched = search_seconds()
            row["first_call_s"], got = timed_first_call(fn, module, inp, cuda)
            row["autotune_s"] = search_seconds() - searched
            tuning.reset()  # the picks forgotten, the file kept: a later process's first call
            row["first_call_cached_s"], got = timed_first_call(fn, module, inp, cuda)
    else:
        row["first_call_s"], got = timed_first_call(fn, module, inp, cuda)
    if ref is not None:
        row["rel_diff"] = rel_diffs(got, ref)
        row["max_rel_diff"] = max(row["rel_diff"].values())
    if cuda:
        row["peak_mib"] = harness.peak_mib(lambda: step(fn, module, inp), clear=leaves(module, inp))
    return row, got


def check_methods(row, fns, module, inp, cuda) -> dict:
    """Each method's first step and numerics (the reference first); name -> step for those that ran."""
    ref = None
    runnable = {}
    for name, fn in fns.items():
        if isinstance(fn, BaseException):
            row["methods"][name] = {"error": reason(fn)}
            continue
        start = time.perf_counter()
        try:
            m, got = check(fn, module, inp, ref, cuda, ours=name.startswith("ours"))
            if ref is None and name in REFERENCES:
                ref, row["reference"] = got, name
                m["rel_diff"], m["max_rel_diff"] = dict.fromkeys(ref, 0.0), 0.0
            del got
            runnable[name] = lambda fn=fn: step(fn, module, inp)
        except Exception as exc:  # noqa: BLE001 - an OOM or a missing kernel is this row's result
            m = {"error": reason(exc)}
            if (name == "liger" or name.startswith("ours")) and type(exc).__name__ not in SKIP_ERRORS:
                traceback.print_exc()  # the transformers implementations' refusals are one line
        row["methods"][name] = m
        free(cuda)
        # a shape whose case outlasts the caller's limit still says which method's first step took the time
        print(f"    {name}: first step and numerics {time.perf_counter() - start:.1f} s", flush=True)
    return runnable


def bench_shape(shape: str, tokens: int, names: list[str], args, device: str, dtype) -> dict:
    cuda = device == "cuda"
    t0 = time.perf_counter()
    module, config = experts_module(shape, args.cpu_smoke, device, dtype, args.seed)
    e, k, h, inter = dims_of(config)
    flops = 3 * 2 * tokens * k * (h * 2 * inter + inter * h)
    row = {"shape": shape, "label": SHAPES[shape]["label"], "tokens": tokens, "E": e, "K": k, "H": h}
    row.update(I=inter, flops=flops, methods={}, reference=None)
    inp = inputs(shape, config, tokens, device, dtype, args.seed)
    runnable = check_methods(row, method_fns(module, shape, names), module, inp, cuda)
    grads = leaves(module, inp)
    try:
        dense, dense_grads = dense_fn(tokens * k, h, inter, device, dtype)
        runnable["dense"] = dense
        grads = grads + dense_grads
    except Exception as exc:  # noqa: BLE001
        row["dense_error"] = reason(exc)
    failed: dict[str, BaseException] = {}
    timings = harness.measure(
        runnable, warmup=args.warmup, repeats=args.iters, grad_to_none=grads, cuda=cuda, errors=failed
    )
    for name, exc in failed.items():
        if name == "dense":
            row["dense_error"] = reason(exc)
        else:
            row["methods"][name] = {"error": reason(exc)}
    for name, timing in timings.items():
        if name == "dense":
            row["dense_ms"], row["dense_spread"] = timing.median, timing.spread
            row["dense_tflops"] = flops / (timing.median * 1e-3) / 1e12
            continue
        m = row["methods"][name]
        m.update(ms=timing.median, spread=timing.spread, tflops=flops / (timing.median * 1e-3) / 1e12)
        if name.startswith("ours"):
            m["autotune"] = autotune_picks()
    print(f"  {shape} T{tokens}: {len(timings)} methods timed ({time.perf_counter() - t0:.1f} s)", flush=True)
    del inp, module, runnable
    free(cuda)
    ratios(row)
    return row


def ratios(row: dict) -> None:
    ms = {n: m["ms"] for n, m in row["methods"].items() if "ms" in m}
    hf = {n: v for n, v in ms.items() if n.startswith("hf:")}
    best = min(hf, key=hf.get) if hf else None
    row["fastest_hf"] = best
    ours = ms.get("ours")
    row["ratios"] = {
        "ours/best_hf": ours / hf[best] if ours and best else None,
        "ours/liger": ours / ms["liger"] if ours and "liger" in ms else None,
        "ours/dense": ours / row["dense_ms"] if ours and row.get("dense_ms") else None,
        "best_hf/dense": hf[best] / row["dense_ms"] if best and row.get("dense_ms") else None,
    }


# --- table


def flat_rows(cases: list[dict]) -> list[dict]:
    """One row per shape, tokens and method (the dense GEMMs as method "dense"): ms, peak MiB, ``x_dense``
    (ms / dense ms), ``ours_over`` (ours' ms / this method's), and for ours the first call's seconds (autotuning
    with an empty cache, then with the cache it filled)."""
    out = []
    for case in cases:
        dense = case.get("dense_ms")
        ours = case["methods"].get("ours", {}).get("ms")
        methods = {**case["methods"], "dense": {"ms": dense, "error": case.get("dense_error")}}
        for name, m in methods.items():
            ms = m.get("ms")
            row = {"shape": case["shape"], "label": case["label"], "tokens": case["tokens"], "method": name}
            row.update(ms=ms, spread=m.get("spread") if name != "dense" else case.get("dense_spread"))
            row.update(tflops=m.get("tflops") if name != "dense" else case.get("dense_tflops"))
            row.update(peak_mib=m.get("peak_mib"), max_rel_diff=m.get("max_rel_diff"))
            row["x_dense"] = ms / dense if ms and dense else None
            row["ours_over"] = ours / ms if ours and ms else None
            if name.startswith("ours"):
                for key in ("autotune_s", "first_call_s", "first_call_cached_s"):
                    row[key] = m.get(key)
            row["error"] = m.get("error")
            out.append(row)
    return out


COLUMNS = [
    ("shape", ""),
    ("T", "d"),
    ("method", ""),
    ("ms", ".3f"),
    ("spread", ".1%"),
    ("TFLOP/s", ".1f"),
    ("peak MiB", ".0f"),
    ("rel diff", ".1e"),
    ("/dense", ".3f"),
    ("ours/this", ".3f"),
    ("tune s", ".1f"),
    ("1st cached s", ".2f"),
    ("note", ""),
]
KEYS = (
    "shape",
    "tokens",
    "method",
    "ms",
    "spread",
    "tflops",
    "peak_mib",
    "max_rel_diff",
    "x_dense",
    "ours_over",
)


def table_rows(rows: list[dict]) -> list[list]:
    return [
        [r[k] for k in KEYS]
        + [r.get("autotune_s"), r.get("first_call_cached_s"), (r.get("error") or "")[:100]]
        for r in rows
    ]


def print_table(cases: list[dict], rows: list[dict], meta: dict) -> None:
    print(
        "ms: median fwd+bwd (grads of hidden, routing weights, parameters); TFLOP/s of 3*2*T*K*(H*2I + I*H); "
        "peak: MiB above the inputs; rel diff: max over output and grads of max|x - ref| / max|ref|; ours/this: "
        "ours' ms over the row's (ours/dense on the dense row); tune s: our first call's tile searches with an "
        "empty cache; 1st cached s: our first call's seconds with the cache that search filled"
    )
    for case in cases:
        print(
            f"{case['label']} ({case['shape']}): T={case['tokens']} E={case['E']} K={case['K']} H={case['H']} "
            f"I={case['I']}, {case['flops'] / 1e12:.2f} TFLOP; reference {case['reference']}; fastest hf "
            f"{case['fastest_hf']}; "
            + ", ".join(f"{k} {harness.cell(v, '.3f')}" for k, v in case["ratios"].items())
        )
    harness.print_table(COLUMNS, table_rows(rows), meta["title"])
    for note in meta["notes"]:
        print(f"note: {note}")
    print(f"json: {meta['json']}")


def record(results: harness.Results, rows: list[dict]) -> None:
    for row in rows:
        case = f"{row['shape']} T={row['tokens']}"
        for key in ("ms", "peak_mib", "x_dense", "autotune_s", "first_call_cached_s"):
            results.add(case, row["method"], key, row.get(key))


def main(argv=None) -> int:
    args = parse(argv)
    if args.llama4:
        return llama4(args)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("moe: no CUDA device; use --cpu-smoke to check the script on the CPU")
        return 1
    device = "cpu" if args.cpu_smoke else "cuda"
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    try:  # ours first: an implementation it registers into transformers is then recognised as not transformers'
        ours_method()
    except Exception as exc:  # noqa: BLE001
        print(f"moe: ours unavailable ({reason(exc)}); its rows are skipped")
    hf_names, notes = transformers_impls()
    every = [f"hf:{n}" for n in hf_names] + ["liger", "ours"]
    names = every if args.methods == "all" else args.methods.split(",")
    names.sort(key=lambda n: REFERENCES.index(n) if n in REFERENCES else len(REFERENCES))  # reference first
    env = harness.capture_env(None if not args.cpu_smoke else "cpu")
    results = harness.Results("moe", args.out, env=env, tag=args.tag)
    info = results.env
    title = (
        f"MoE experts fwd+bwd, {'fp32 CPU smoke' if args.cpu_smoke else 'bf16'}; {info.get('device', 'cpu')}, "
        f"torch {info['torch']}, triton {info['triton']}, transformers {info['transformers']}, "
        f"liger-kernel {info['liger_kernel']}"
    )
    print(title, flush=True)
    meta = {
        "title": title,
        "env": info,
        "args": vars(args),
        "notes": notes,
        "json": str(results.path("json")),
    }
    cases, start = [], time.perf_counter()
    for shape in args.shapes.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            cases.append(bench_shape(shape, tokens, names, args, device, dtype))
            meta["wall_s"] = time.perf_counter() - start
            # after each case: a cut run keeps what it measured (the CSV rows come with the last write)
            payload = {"meta": meta, "rows": flat_rows(cases), "cases": cases, "env": info}
            harness.write_json(results.path("json").name, payload, results.out)
    rows = flat_rows(cases)
    record(results, rows)
    results.write({"meta": meta, "rows": rows, "cases": cases})
    print_table(cases, rows, meta)
    ok = any("ms" in m for case in cases for m in case["methods"].values())
    return 0 if ok else 1


# --- Llama 4's MoE block (--llama4)
#
# transformers' Llama4TextMoe runs every expert on every token (inputs scaled by the dense sigmoid router scores,
# zero where an expert is not selected); the llama4 registry entry's moe_experts forward runs only the top-k
# selected experts on the grouped-GEMM kernel. Llama-4-Scout-17B-16E's dims (16 experts, top-1, hidden 5120,
# expert and shared-expert intermediate 8192), bf16, weights ~ N(0, 0.02^2), hidden ~ N(0, 1), fixed seeds. Per
# method: median ms of forward + backward (gradients of the hidden states and every parameter), peak MiB above
# the inputs, and the largest relative difference (output and every gradient) against transformers' block.


def llama4_block(args, device, dtype) -> torch.nn.Module:
    from transformers.models.llama4 import modeling_llama4
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

    dims = (32, 24) if args.cpu_smoke else (5120, 8192)
    config = Llama4TextConfig(
        hidden_size=dims[0],
        intermediate_size=dims[1],
        intermediate_size_mlp=dims[1],
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
    )
    block = modeling_llama4.Llama4TextMoe(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return block.to(device, dtype)


def llama4_step(forward, x):
    def run():
        out, _ = forward(x)
        out.backward(torch.ones_like(out))

    return run


def llama4_grads(forward, block, x) -> list[torch.Tensor]:
    for t in (x, *block.parameters()):
        t.grad = None
    llama4_step(forward, x)()
    out, _ = forward(x)
    return [out.detach(), *(t.grad.clone() for t in (x, *block.parameters()))]


def max_rel(got: list, want: list) -> float:
    return max(
        ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
        for a, b in zip(got, want, strict=True)
    )


def llama4(args) -> int:
    from liger_registry.modules.moe import moe_experts_forward
    from liger_registry.registry import load_registry

    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        print("moe --llama4: no CUDA device; use --cpu-smoke to check the script on the CPU")
        return 1
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    block = llama4_block(args, device, dtype)
    spec = load_registry().families["llama4_text"].entry.kernels.moe_experts
    methods = {"hf": block.forward, "ours": moe_experts_forward(spec).__get__(block)}
    rows = []
    for tokens in [16] if args.cpu_smoke else [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(1, tokens, block.hidden_dim, device=device, dtype=dtype).requires_grad_()
        params = [x, *block.parameters()]
        ref = llama4_grads(methods["hf"], block, x)
        steps = {name: llama4_step(forward, x) for name, forward in methods.items()}
        warm, reps = (0, 1) if args.cpu_smoke else (args.warmup, args.iters)
        timings = harness.measure(steps, warmup=warm, repeats=reps, grad_to_none=params, cuda=cuda)
        for name, forward in methods.items():
            rel = max_rel(llama4_grads(forward, block, x), ref)
            peak = harness.peak_mib(steps[name], clear=params) if cuda else float("nan")
            ms, spread = timings[name].median, timings[name].spread
            rows.append({"tokens": tokens, "method": name, "ms": ms, "spread": spread, "peak_mib": peak})
            rows[-1]["rel_diff"] = rel
    results = harness.Results("moe", args.out, tag="llama4", env=harness.capture_env(None if cuda else "cpu"))
    for r in rows:
        for key in ("ms", "peak_mib", "rel_diff"):
            results.add(f"llama4 T={r['tokens']}", r["method"], key, r[key])
    by = {(r["tokens"], r["method"]): r for r in rows}
    for r in rows:
        r["x_hf"] = r["ms"] / by[(r["tokens"], "hf")]["ms"]
    path = results.write({"args": vars(args), "rows": rows})
    cols = [("T", "d"), ("method", ""), ("ms", ".3f"), ("spread", ".1%"), ("/hf", ".3f"), ("peak MiB", ".0f")]
    cols.append(("rel diff", ".1e"))
    keys = ("tokens", "method", "ms", "spread", "x_hf", "peak_mib", "rel_diff")
    title = f"Llama4TextMoe fwd+bwd, {dtype}, E={args.experts} top-{args.top_k}, hidden {block.hidden_dim}"
    harness.print_table(cols, [[r[k] for k in keys] for r in rows], title)
    print(f"json: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
