"""MoE experts benchmark (GPU): the experts module alone, forward + backward, bf16; every transformers
`experts_implementation` vs liger-kernel's LigerExperts vs ours (liger_registry.modules.moe.experts_forward).

Shapes (each at 4096 and 16384 tokens, --tokens): Qwen3-30B-A3B (128 experts, top-8, hidden 2048, expert
intermediate 768, SiLU), Mixtral-8x7B (8 experts, top-2, hidden 4096, intermediate 14336, SiLU) and GPT-OSS-20B
(32 experts, top-4, hidden 2880, intermediate 2880, clamped SwiGLU over interleaved gate/up pairs, biases,
transposed [E, in, out] weights) and DBRX-132B (16 experts, top-4, hidden 6144, intermediate 10752, SiLU; its
own experts loop, gate/up/down as 2-D per-expert parameters, no experts_implementation). Each shape's transformers
experts module (Qwen3MoeExperts, MixtralExperts, GptOssExperts, DbrxExperts) is built from its config class, bf16 on the GPU, weights ~ N(0, 0.02^2) with a fixed seed; the
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

Per shape x tokens x method: median ms of fwd+bwd (CUDA events, --warmup steps then --iters timed steps;
gradients of hidden_states, routing weights and every expert parameter), TFLOP/s counting
3 * 2 * T*K * (H*2I + I*H), peak MiB above the inputs (max_memory_allocated during one step minus what was
allocated before it; parameter gradients included), and the largest relative difference (max|x - ref| / max|ref|
over output and every gradient) against the reference, transformers' "eager" in bf16 (grouped_mm if eager
fails). The same FLOPs as dense bf16 GEMMs ([T*K, H] x [H, 2I] and [T*K, I] x [I, H], fwd+bwd) are timed in the
same run. Ratios (time, lower is better for ours): ours / fastest transformers implementation, ours / liger,
ours / dense. JSON under $OUT (or benchmarks/results/, --out); the table is printed last.

Usage: python benchmarks/bench_moe.py [--shapes qwen3_moe,mixtral,gpt_oss,dbrx] [--tokens 4096,16384]
                                      [--methods hf:eager,hf:grouped_mm,liger,ours] [--warmup 5] [--iters 20]
       python benchmarks/bench_moe.py --cpu-smoke    # tiny dims, fp32, CPU, 1 iteration: checks the script
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import inspect
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import env_info, incremental_peak_mib, write_json  # noqa: E402

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
    p.add_argument(
        "--methods",
        default="all",
        help="comma list (hf:eager, hf:grouped_mm, ..., liger, ours, ours:bmN: N rows per block)",
    )
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny dims, fp32, CPU, 1 iteration")
    p.add_argument("--out", default=None, help="directory for the JSON (default: $OUT or benchmarks/results)")
    args = p.parse_args(argv)
    if args.cpu_smoke:
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


def ours_method(shape: str | None = None, block_m: int | None = None):
    """experts_forward(module, hidden_states, top_k_index, top_k_weights[, gate=the family's gate]); ``block_m``
    (method ``ours:bmN``): the routing's rows per block forced to N, to compare with the library's choice."""
    from liger_registry.modules.moe import experts_forward

    spec = SHAPES[shape] if shape else {}
    options = {**({"gate": spec["gate"]} if "gate" in spec else {}), **spec.get("layout", {})}
    missing = set(options) - set(inspect.signature(experts_forward).parameters)
    if missing:
        raise Skip(f"experts_forward takes no {', '.join(sorted(missing))}: cannot run this shape's layout")

    def fn(module, x, idx, w):
        with forced_block_rows(block_m):
            return experts_forward(module, x, idx, w, **options).reshape(x.shape)

    return fn


def autotune_picks() -> dict[str, str]:
    """Our MoE kernels' autotuner choices so far, ``kernel(key) -> config``: two runs whose times differ may differ
    in these (the key's ROWS is the routed rows' power-of-two bucket, one pick per token count's bucket)."""
    try:
        from liger_registry.kernels.moe import triton_kernels
    except ImportError:
        return {}
    picks = {}
    for name in ("_rows_kernel", "_wgrad_kernel"):
        tuner = getattr(triton_kernels, name, None)
        for key, config in getattr(tuner, "cache", {}).items():
            # the key's named values, then the dtypes triton appends: zip stops at the names
            args = ", ".join(f"{k}={v}" for k, v in zip(tuner.keys, key, strict=False))
            picks[f"{name}({args})"] = str(config)
    return picks


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


def median_ms(run, zero, warmup: int, iters: int, cuda: bool) -> float:
    """Median of `iters` steps after `warmup` steps: CUDA events per step (perf_counter on the CPU)."""
    for _ in range(warmup):
        zero()
        run()
    times, events = [], []
    for _ in range(iters):
        zero()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            events.append((start, end))
        else:
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) * 1e3)
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
    return statistics.median(times)


def dense_ms(tk: int, h: int, inter: int, device: str, dtype, args) -> float:
    """The same FLOPs as dense GEMMs: [TK, H] x [H, 2I] and [TK, I] x [I, H], forward and backward."""
    mk = lambda *s: torch.randn(*s, device=device, dtype=dtype).requires_grad_()  # noqa: E731
    a, w1, b, w2 = mk(tk, h), mk(h, 2 * inter), mk(tk, inter), mk(inter, h)
    dy1 = torch.randn(tk, 2 * inter, device=device, dtype=dtype)
    dy2 = torch.randn(tk, h, device=device, dtype=dtype)

    def run():
        torch.mm(a, w1).backward(dy1)
        torch.mm(b, w2).backward(dy2)

    def zero():
        for t in (a, w1, b, w2):
            t.grad = None

    return median_ms(run, zero, max(args.warmup, 1), args.iters, device == "cuda")


def free(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]


def measure(fn, module, inp, ref, args, cuda) -> tuple[dict, dict]:
    """The method's row, and its output and gradients of the first step (the reference's, when it is one)."""
    grads = leaves(module, inp)

    def zero():
        for t in grads:
            t.grad = None

    row: dict = {}
    got = results(fn, module, inp)  # also the first warm-up (and liger's autotuning)
    if ref is not None:
        row["rel_diff"] = rel_diffs(got, ref)
        row["max_rel_diff"] = max(row["rel_diff"].values())
    if cuda:
        row["peak_mib"] = incremental_peak_mib(lambda: step(fn, module, inp), clear=grads)
    row["ms"] = median_ms(lambda: step(fn, module, inp), zero, args.warmup, args.iters, cuda)
    zero()
    return row, got


def bench_shape(shape: str, tokens: int, names: list[str], args, device: str, dtype) -> dict:
    cuda = device == "cuda"
    module, config = experts_module(shape, args.cpu_smoke, device, dtype, args.seed)
    e, k, h, inter = dims_of(config)
    flops = 3 * 2 * tokens * k * (h * 2 * inter + inter * h)
    row = {
        "shape": shape,
        "label": SHAPES[shape]["label"],
        "tokens": tokens,
        "E": e,
        "K": k,
        "H": h,
        "I": inter,
        "flops": flops,
        "methods": {},
    }
    inp = inputs(shape, config, tokens, device, dtype, args.seed)
    ref, ref_name = None, None
    for name, fn in method_fns(module, shape, names).items():
        t0 = time.perf_counter()
        if isinstance(fn, BaseException):
            m = {"error": reason(fn)}
        else:
            try:
                m, got = measure(fn, module, inp, ref, args, cuda)
                if ref is None and name in REFERENCES:
                    ref, ref_name = got, name
                    m["rel_diff"], m["max_rel_diff"] = dict.fromkeys(ref, 0.0), 0.0
                del got
            except Exception as exc:  # noqa: BLE001 - an OOM or a missing kernel is this row's result
                m = {"error": reason(exc)}
                if (name == "liger" or name.startswith("ours")) and type(exc).__name__ not in SKIP_ERRORS:
                    traceback.print_exc()  # the transformers implementations' refusals are one line
        if "ms" in m:
            m["tflops"] = flops / (m["ms"] * 1e-3) / 1e12
        if name.startswith("ours") and "ms" in m:
            m["autotune"] = autotune_picks()
        row["methods"][name] = m
        free(cuda)
        what = (
            f"{m['ms']:.3f} ms, {m['tflops']:.1f} TFLOP/s, rel diff {m.get('max_rel_diff', float('nan')):.1e}"
            if "ms" in m
            else f"skipped: {m['error'][:160]}"
        )
        print(f"  {shape} T{tokens} {name:<14} {what} ({time.perf_counter() - t0:.1f} s)", flush=True)
        for kernel, config in m.get("autotune", {}).items():
            print(f"    autotune {kernel}: {config}")
    row["reference"] = ref_name
    del inp, module, ref
    free(cuda)
    try:
        row["dense_ms"] = dense_ms(tokens * k, h, inter, device, dtype, args)
        row["dense_tflops"] = flops / (row["dense_ms"] * 1e-3) / 1e12
    except Exception as exc:  # noqa: BLE001
        row["dense_error"] = reason(exc)
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


def fmt(x, spec: str) -> str:
    width = spec.split(".")[0]
    return "-".rjust(int(width) if width.isdigit() else 1) if x is None else format(x, spec)


def print_table(rows: list[dict], meta: dict) -> None:
    print(f"\n{meta['title']}")
    print(
        "ms: median fwd+bwd (grads of hidden, routing weights, parameters); TFLOP/s of 3*2*T*K*(H*2I + I*H); "
        "peak: MiB above the inputs; rel diff: max over output and grads of max|x - ref| / max|ref|"
    )
    for row in rows:
        print(
            f"\n{row['label']} ({row['shape']}): T={row['tokens']} E={row['E']} K={row['K']} H={row['H']} "
            f"I={row['I']}, {row['flops'] / 1e12:.2f} TFLOP; reference {row['reference']}"
        )
        print(f"  {'method':<16}{'ms':>10}{'TFLOP/s':>9}{'peak MiB':>10}{'rel diff':>10}")
        for name, m in row["methods"].items():
            if "ms" not in m:
                print(f"  {name:<16}skipped: {m['error'][:150]}")
                continue
            print(
                f"  {name:<16}{m['ms']:10.3f}{m['tflops']:9.1f}{fmt(m.get('peak_mib'), '10.0f')}"
                f"{fmt(m.get('max_rel_diff'), '10.1e')}"
            )
        if "dense_ms" in row:
            print(f"  {'dense GEMMs':<16}{row['dense_ms']:10.3f}{row['dense_tflops']:9.1f}")
        else:
            print(f"  {'dense GEMMs':<16}failed: {row.get('dense_error', '?')[:150]}")
        r = row["ratios"]
        print(
            f"  time ratios: ours/{row['fastest_hf'] or 'best hf'} {fmt(r['ours/best_hf'], '.3f')}, "
            f"ours/liger {fmt(r['ours/liger'], '.3f')}, ours/dense {fmt(r['ours/dense'], '.3f')}, "
            f"best hf/dense {fmt(r['best_hf/dense'], '.3f')}"
        )
    for note in meta["notes"]:
        print(f"note: {note}")
    print(f"json: {meta['json']}")


def main(argv=None) -> int:
    args = parse(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("bench_moe: no CUDA device; use --cpu-smoke to check the script on the CPU")
        return 1
    device = "cpu" if args.cpu_smoke else "cuda"
    dtype = torch.float32 if args.cpu_smoke else torch.bfloat16
    try:  # ours first: an implementation it registers into transformers is then recognised as not transformers'
        ours_method()
    except Exception as exc:  # noqa: BLE001
        print(f"bench_moe: ours unavailable ({reason(exc)}); its rows are skipped")
    hf_names, notes = transformers_impls()
    every = [f"hf:{n}" for n in hf_names] + ["liger", "ours"]
    names = every if args.methods == "all" else args.methods.split(",")
    names.sort(key=lambda n: REFERENCES.index(n) if n in REFERENCES else len(REFERENCES))  # reference first
    import transformers

    info = {**env_info(), "transformers": transformers.__version__}
    title = (
        f"MoE experts fwd+bwd, {'fp32 CPU smoke' if args.cpu_smoke else 'bf16'}; {info.get('device', 'cpu')}, "
        f"torch {info['torch']}, triton {info['triton']}, transformers {info['transformers']}, "
        f"liger-kernel {info['liger_kernel'][:40]}"
    )
    print(title, flush=True)
    if args.out is not None:
        os.environ["OUT"] = args.out
    name = "bench_moe_smoke.json" if args.cpu_smoke else "bench_moe.json"
    meta = {"title": title, "env": info, "args": vars(args), "notes": notes}
    rows, start = [], time.perf_counter()
    for shape in args.shapes.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            rows.append(bench_shape(shape, tokens, names, args, device, dtype))
            meta["wall_s"] = time.perf_counter() - start
            meta["json"] = str(
                write_json(name, {"meta": meta, "rows": rows})
            )  # after each row: a cut run keeps it
    print_table(rows, meta)
    ok = any("ms" in m for row in rows for m in row["methods"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
