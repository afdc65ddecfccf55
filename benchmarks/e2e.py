"""End-to-end training benchmark: HF unpatched vs liger-kernel vs ours, one process per configuration.

Training steps (forward, backward, AdamW) of a Llama-3-8B-shaped (hidden 4096, MLP 14336, 32/8 heads, vocabulary
128256) and a Qwen3-8B-shaped (hidden 4096, MLP 12288, 32/8 heads, head_dim 128, vocabulary 151936) model cut
to 2 and 4 layers; bf16 weights built on the GPU with a fixed seed, SDPA attention, 4096 and 8192 tokens per step
(--batch sequences of tokens/batch). Methods: `hf` (unpatched), `liger` (liger-kernel's own
apply_liger_kernel_to_llama / _qwen3(model=...), a benchmark-only peer), `ours` (liger_registry.apply(model)),
`ours_tp` (apply(model, policy="throughput")), and `hf_compile` / `ours_compile` (the same model, then
`torch.compile(model)` with inductor's default mode; the first steps pay the compilation, reported apart as
`compile_s`: the warm-up steps' time beyond as many median steps, and `first_step_s`). Other compile recipes,
by name, for hf and ours (opt in): `_compile_regional` (each decoder layer compiled, `layer.compile()`),
`_compile_autotune` (mode max-autotune-no-cudagraphs), `_compile_cudagraphs` (mode reduce-overhead); each
recipe's ours/hf and ours-compiled/ours-eager ratios are printed under the table. Each configuration runs in its own process (a fresh CUDA context
and allocator: peak memory does not inherit another run's fragmentation), the methods of one configuration next
to each other and in a rotated order per repeat. By default the processes are forked from this driver after it
imported torch and transformers once (it never touches CUDA); --spawn starts each one from scratch instead.
Per run: tokens/s of the median step after the warm-up steps, peak allocated GiB, the loss of every step (same
seed and data for every method). Table (ours/HF and ours/peer ratios, the targets) printed last; JSON and
one PNG (tok/s bars, peak memory bars, loss curves) under --out.
MoE rows (--models, not in the default): `qwen3_moe` (Qwen3-30B-A3B: hidden 2048, 32/4 heads, head_dim 128, 128
experts top-8 of intermediate 768, vocabulary 151936), `mixtral` (Mixtral-8x7B: hidden 4096, 32/8 heads, 8
experts top-2 of intermediate 14336, vocabulary 32000), `gpt_oss` (GPT-OSS-20B: hidden 2880, 64/8 heads, head_dim
64, 32 experts top-4 of intermediate 2880, vocabulary 201088, bf16 weights, eager attention: no SDPA with sinks);
`hf` runs transformers' default experts implementation (recorded per run), `liger` liger-kernel's
apply_liger_kernel_to_qwen3_moe / _mixtral (experts -> LigerExperts) / _gpt_oss (no experts kernel: HF's stay).

Usage: python -m benchmarks e2e [--quick] [--models llama,qwen3] [--layers 2,4] [--tokens 4096,8192]
                                [--methods hf,liger,ours,ours_tp] [--repeats 2] [--steps 8] [--warmup 3]
       python -m benchmarks e2e --models qwen3_moe,mixtral,gpt_oss --layers 4 --tokens 4096
       python -m benchmarks e2e --cpu-smoke    # tiny dims on CPU, 2 steps, no peer: checks the script
       python -m benchmarks e2e --layers 2 --tokens 4096 --repeats 1 \
           --methods hf_compile,ours_compile,hf_compile_regional,ours_compile_regional,ours    # recipes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

# torch.cuda.is_available() through NVML in the driver: it must not initialise CUDA before it forks the runs
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
NVML_CHECK_BEFORE = os.environ.get(NVML_CHECK)
MODELS = {
    "llama": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
    ),
    # MoE rows: every layer sparse; the router's auxiliary loss stays off (output_router_logits False)
    "qwen3_moe": dict(  # Qwen3-30B-A3B
        model_type="qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,  # dense MLP size, unused: no mlp_only_layers
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
    ),
    "mixtral": dict(  # Mixtral-8x7B
        model_type="mixtral",
        hidden_size=4096,
        intermediate_size=14336,
        num_local_experts=8,
        num_experts_per_tok=2,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32000,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
    ),
    "gpt_oss": dict(  # GPT-OSS-20B, plain bf16 weights (no quantization_config: build_model checks the dtypes)
        model_type="gpt_oss",
        hidden_size=2880,
        intermediate_size=2880,
        num_local_experts=32,
        num_experts_per_tok=4,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=201088,
        # attention sinks: transformers has no SDPA path for GPT-OSS (_supports_sdpa False), every method runs
        # its eager attention (sliding-window layers too: [heads, T, T] scores per layer)
        attn_implementation="eager",
    ),
}
SMOKE_DIMS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
)
SMOKE_MOE = {  # on top of SMOKE_DIMS for the MoE rows
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
}
COMPILED = "_compile"
# compile recipes, by the method's suffix: (what is compiled, inductor mode). `model`: torch.compile(model), what
# Trainer's torch_compile does; `layers`: each decoder layer's module compiled in place (`layer.compile()`, the
# regional compilation transformers and torchtitan recommend: one layer's graph reused by every layer, the head and
# embeddings eager); reduce-overhead adds CUDA graphs
RECIPES = {
    COMPILED: ("model", None),
    "_compile_regional": ("layers", None),
    "_compile_autotune": ("model", "max-autotune-no-cudagraphs"),
    "_compile_cudagraphs": ("model", "reduce-overhead"),
}
COMPILED_METHODS = tuple(f"{base}{suffix}" for suffix in RECIPES for base in ("hf", "ours"))
METHODS = ("hf", "liger", "ours", "ours_tp", "hf_compile", "ours_compile")
OPT_IN = tuple(m for m in COMPILED_METHODS if m not in METHODS)  # the other recipes, by name
CPU_METHODS = ("hf", "ours", "ours_tp")  # no CUDA, no peer
PEER_APPLY = {
    "llama": "apply_liger_kernel_to_llama",
    "qwen3": "apply_liger_kernel_to_qwen3",
    "qwen3_moe": "apply_liger_kernel_to_qwen3_moe",  # experts -> LigerExperts (fused MoE)
    "mixtral": "apply_liger_kernel_to_mixtral",  # experts -> LigerExperts (fused MoE)
    # 0.8.5: rope, RMSNorm, FLCE; swiglu=False by default and no experts kernel: HF's experts stay
    "gpt_oss": "apply_liger_kernel_to_gpt_oss",
}
TARGETS = "ours >= 1.0x HF tok/s, >= 1.1x liger tok/s, peak <= liger + 0.25 GiB, ours_compile >= 1.0x hf_compile tok/s"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="llama,qwen3")
    p.add_argument("--layers", default="2,4")
    p.add_argument("--tokens", default="4096,8192", help="tokens per step")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--batch", type=int, default=1, help="sequences per step (seq = tokens / batch)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    p.add_argument(
        "--lr",
        type=float,
        default=1e-4,
        help="AdamW learning rate (1e-3 made the bf16 loss curves chaotic on the H200: 12.6 -> 0.03 -> 6.5)",
    )
    p.add_argument(
        "--optimizer",
        choices=("fused", "foreach"),
        default="fused",
        help="AdamW implementation: fused is what transformers' Trainer uses by default with torch >= 2.8 "
        "(optim adamw_torch_fused); foreach costs about 2x the optimizer time",
    )
    p.add_argument("--timeout-s", type=float, default=120.0, help="per process")
    p.add_argument(
        "--budget-s", type=float, default=510.0, help="start no new process after this many seconds"
    )
    p.add_argument("--spawn", action="store_true", help="start every process from scratch instead of forking")
    p.add_argument("--quick", action="store_true", help="2 layers, both models and token counts, 1 repeat")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny dims on CPU, 2 steps, methods without CUDA")
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the compiled methods (the CPU smoke checks the recipes with aot_eager)",
    )
    harness.add_out_arg(p)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.repeats = "2", 1
    if args.cpu_smoke:
        if args.tokens == "4096,8192":
            args.tokens = "64"
        if args.methods == ",".join(METHODS):
            args.methods = ",".join(CPU_METHODS)
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
    unknown = set(args.methods.split(",")) - {*METHODS, *OPT_IN}
    if unknown:
        p.error(f"unknown methods {sorted(unknown)} (known: {', '.join((*METHODS, *OPT_IN))})")
    return args


def jobs_of(args: argparse.Namespace) -> list[dict]:
    """Every process to run, in order: per repeat, per configuration, its methods in a rotated order."""
    methods = args.methods.split(",")
    configs = [
        (m, int(layer), int(t))
        for m in args.models.split(",")
        for layer in args.layers.split(",")
        for t in args.tokens.split(",")
    ]
    jobs = []
    for r in range(args.repeats):
        for i, (model, layers, tokens) in enumerate(configs):
            k = (r + i) % len(methods)
            for method in methods[k:] + methods[:k]:
                jobs.append(
                    dict(
                        model=model,
                        layers=layers,
                        tokens=tokens,
                        method=method,
                        repeat=r,
                        batch=args.batch,
                        steps=args.steps,
                        warmup=args.warmup,
                        lr=args.lr,
                        optimizer=args.optimizer,
                        smoke=args.cpu_smoke,
                        compile_backend=args.compile_backend,
                    )
                )
    return jobs


# --- one configuration (runs in its own process)


def build_model(job: dict, device: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = dict(MODELS[job["model"]])
    model_type = dims.pop("model_type")
    attn = dims.pop("attn_implementation", "sdpa")
    if job["smoke"]:
        dims.update(SMOKE_DIMS, **SMOKE_MOE.get(job["model"], {}))
    config = AutoConfig.for_model(
        model_type, num_hidden_layers=job["layers"], tie_word_embeddings=False, use_cache=False, **dims
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=job["dtype"], attn_implementation=attn)
    dtypes = {p.dtype for p in model.parameters()}
    quant = getattr(model, "hf_quantizer", None) or getattr(config, "quantization_config", None)
    if dtypes != {job["dtype"]} or quant is not None:  # e.g. GPT-OSS built quantized (MXFP4) instead of bf16
        raise RuntimeError(f"{job['model']}: parameters {sorted(map(str, dtypes))}, quantization {quant}")
    return model.train(), config


def recipe_of(method: str) -> tuple[str, tuple[str, str | None] | None]:
    """``(base method, (what is compiled, mode) or None)``: `ours_compile_regional` patches as `ours` does, then
    compiles each decoder layer."""
    for suffix, recipe in RECIPES.items():
        if method.endswith(suffix):
            return method.removesuffix(suffix), recipe
    return method, None


def base_method(method: str) -> str:
    """The method without its compile suffix: `ours_compile` patches as `ours` does."""
    return recipe_of(method)[0]


def is_compiled(method: str) -> bool:
    return recipe_of(method)[1] is not None


def decoder_layers(model):
    """The decoder layers' modules of a causal LM (``model.model.layers``, or a multimodal model's text model's)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers to compile one by one")
    return layers


def compile_model(model, method: str, backend: str = "inductor", how: str | None = None):
    """The method's compile recipe applied to ``model`` (``how`` overrides what is compiled); returns what to call.
    A mode is an inductor option: another backend (the CPU smoke's) compiles without it."""
    import torch

    _, (what, mode) = recipe_of(method)
    kwargs = {"backend": backend, **({"mode": mode} if mode and backend == "inductor" else {})}
    if (how or what) == "layers":
        for layer in decoder_layers(model):
            layer.compile(**kwargs)
        return model
    return torch.compile(model, **kwargs)


def patch(job: dict, model) -> dict:
    """Install the method's kernels; what was installed (and, for ours, the FLCE plan at this token count)."""
    method = base_method(job["method"])
    if method == "hf":
        return {}
    if method == "liger":
        import liger_kernel.transformers as lk

        getattr(lk, job.get("peer_apply") or PEER_APPLY[job["model"]])(model=model)
        return {}
    import liger_registry

    handle = (
        liger_registry.apply(model, policy="throughput")
        if method == "ours_tp"
        else liger_registry.apply(model)
    )
    info = {"patched": sorted({str(r.kernel) for r in handle.report.patched})}
    flce = handle.report.config.entry.flce
    budget = {
        k: getattr(flce, k) for k in ("chunk_mem_const", "max_chunk_mib", "strategy") if hasattr(flce, k)
    }
    budget = {k: getattr(v, "value", v) for k, v in budget.items() if v is not None}  # enum -> its value
    info["flce_budget"] = {k: str(v) for k, v in budget.items()}
    try:
        from liger_registry.kernels import flce_plan

        cfg = model.config
        info["flce_plan"] = str(flce_plan(job["tokens"], cfg.hidden_size, cfg.vocab_size, **budget))
    except Exception as exc:  # noqa: BLE001 - the planner may not be merged on this branch
        info["flce_plan"] = f"n/a ({type(exc).__name__}: {exc})"[:160]
    return info


def train(job: dict, model, device: str) -> dict:
    import torch

    cuda = device == "cuda"
    vocab, seq = model.config.vocab_size, job["tokens"] // job["batch"]
    gen = torch.Generator().manual_seed(1234)  # two fixed batches in turn: the loss goes down, same for all
    batches = [torch.randint(0, vocab, (job["batch"], seq), generator=gen).to(device) for _ in range(2)]
    kind = job.get("optimizer", "fused")
    fused = (
        kind == "fused" and cuda
    )  # the fused AdamW needs CUDA (or a recent CPU build): the smoke uses foreach
    optimizer = torch.optim.AdamW(model.parameters(), lr=job["lr"], fused=fused, foreach=not fused)
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    cudagraphs = recipe_of(job["method"])[1] == RECIPES["_compile_cudagraphs"]

    def one(step: int):
        if cudagraphs:  # a new iteration: the graphs' outputs of the last one may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        ids = batches[step % 2]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # a copy: under CUDA graphs the loss lives in the graph's memory, which the next replay overwrites
        return loss.detach().clone()

    losses, times = harness.time_steps(one, job["steps"], cuda)
    losses = [float(x) for x in losses]
    median = harness.steady_median(times, job["warmup"])
    return {
        "compile_s": max(0.0, sum(times[: job["warmup"]]) - median * min(job["warmup"], len(times))),
        "first_step_s": times[0] if times else None,  # the first compile (and the first call's allocations)
        "losses": losses,
        "step_s": times,
        "median_step_s": median,
        "tokens_per_s": job["tokens"] / median,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def run_job(job: dict) -> dict:
    t0 = time.perf_counter()
    import torch

    device = "cpu" if job["smoke"] else "cuda"
    job = {**job, "dtype": torch.float32 if job["smoke"] else torch.bfloat16}
    out: dict = {"import_s": time.perf_counter() - t0}
    try:
        t = time.perf_counter()
        model, config = build_model(job, device)
        out["build_s"] = time.perf_counter() - t
        if getattr(config, "_experts_implementation", None):  # MoE: what transformers' experts run (hf rows)
            out["hf_experts_implementation"] = config._experts_implementation
        t = time.perf_counter()
        out.update(patch(job, model))
        if is_compiled(job["method"]):
            model = compile_model(model, job["method"], job.get("compile_backend", "inductor"))
        out["apply_s"] = time.perf_counter() - t
        out.update(train(job, model, device))
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - an OOM or a missing peer is a result of this configuration
        harness.record_failure(out, exc)
    import transformers

    out["env"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if device == "cuda" and out["ok"]:
        out["env"]["device"] = torch.cuda.get_device_name()
    return out


def child_main(job: dict, result: str, run=None) -> None:
    """One process: ``run`` (this script's run_job unless a sibling benchmark passes its own) writes its result."""
    if NVML_CHECK_BEFORE is None:  # the driver's setting goes: CUDA starts here
        os.environ.pop(NVML_CHECK, None)
    else:
        os.environ[NVML_CHECK] = NVML_CHECK_BEFORE
    Path(result).write_text(json.dumps((run or run_job)(job)))


# --- the driver


def preimport(smoke: bool) -> None:
    """Import once what every forked process needs, without initialising CUDA (a fork after that breaks it)."""
    os.environ[NVML_CHECK] = "1"
    import torch
    import transformers.models.gpt_oss.modeling_gpt_oss  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    import transformers.models.mixtral.modeling_mixtral  # noqa: F401
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401
    import transformers.models.qwen3_moe.modeling_qwen3_moe  # noqa: F401

    import liger_registry  # noqa: F401
    import liger_registry.kernels  # noqa: F401

    if not smoke and torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised before the fork; run with --spawn")


def timeout_of(job: dict, args: argparse.Namespace) -> float:
    """A compiled method gets twice the time: its first steps compile the model."""
    if job.get("timeout_s"):
        return job["timeout_s"]
    return args.timeout_s * (2 if is_compiled(job["method"]) else 1)


def launch(job: dict, args: argparse.Namespace, tmp: Path, index: int, child=None, module=None) -> dict:
    """Run one job in its own process: forked into ``child`` (default child_main), or with --spawn as
    ``python -m MODULE --child JOB --result PATH`` (default this module); sibling benchmarks pass their own pair."""
    result = tmp / f"job{index}.json"
    start = time.perf_counter()
    if args.spawn:
        cmd = [
            sys.executable,
            "-m",
            module or "benchmarks.e2e",
            "--child",
            json.dumps(job),
            "--result",
            str(result),
        ]
        try:
            rc = subprocess.run(cmd, cwd=harness.ROOT, timeout=timeout_of(job, args)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    else:
        import multiprocessing

        proc = multiprocessing.get_context("fork").Process(
            target=child or child_main, args=(job, str(result))
        )
        proc.start()
        proc.join(timeout_of(job, args))
        if proc.is_alive():
            proc.kill()
            proc.join()
            rc = "timeout"
        else:
            rc = proc.exitcode
    out = (
        json.loads(result.read_text()) if result.exists() else {"ok": False, "error": f"process ended: {rc}"}
    )
    out["wall_s"] = time.perf_counter() - start
    return {**job, **out}


def fork_broke_cuda(error: str) -> bool:
    """The error a child gets when CUDA was initialised in the driver before the fork."""
    return "CUDA" in error and any(k in error for k in ("initialization error", "re-initialize", "fork"))


def drive(args: argparse.Namespace) -> list[dict]:
    if not args.spawn:
        preimport(args.cpu_smoke)
    jobs, runs, start = jobs_of(args), [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, job in enumerate(jobs):
            elapsed = time.perf_counter() - start
            longest = max((r.get("wall_s", 0.0) for r in runs), default=0.0)
            if elapsed + longest > args.budget_s:
                runs.append(
                    {**job, "ok": False, "error": f"not run: time budget {args.budget_s:.0f} s spent"}
                )
                continue
            r = launch(job, args, Path(tmp), i)
            if not args.spawn and not r.get("ok") and fork_broke_cuda(r.get("error", "")):
                print(f"e2e: CUDA does not start in a forked process ({r['error'][:120]}); spawning instead")
                args.spawn = True
                r = launch(job, args, Path(tmp), i)
            runs.append(r)
            what = (
                f"{r['tokens_per_s']:,.0f} tok/s, peak {r['peak_gib'] or 0:.2f} GiB, loss {r['losses'][-1]:.4f}"
                if r.get("ok")
                else r.get("error", "")[:150]
            )
            print(
                f"[{i + 1}/{len(jobs)} {elapsed:4.0f}s] {job['model']} L{job['layers']} T{job['tokens']} "
                f"{job['method']:<7} r{job['repeat']}: {what} (process {r['wall_s']:.1f} s)",
                flush=True,
            )
    return runs


# --- aggregation, table, plots


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (model, layers, tokens): per method mean tok/s over repeats, max peak, first loss curve."""
    rows = []
    keys = list(dict.fromkeys((r["model"], r["layers"], r["tokens"]) for r in runs))
    for model, layers, tokens in keys:
        row = {"model": model, "layers": layers, "tokens": tokens, "methods": {}}
        for r in runs:
            if (r["model"], r["layers"], r["tokens"]) != (model, layers, tokens):
                continue
            m = row["methods"].setdefault(
                r["method"],
                {"tokens_per_s": [], "peak_gib": [], "compile_s": [], "first_step_s": [], "errors": []},
            )
            if r.get("ok"):
                m["tokens_per_s"].append(r["tokens_per_s"])
                m["compile_s"].append(r.get("compile_s", 0.0))
                m["first_step_s"].append(r.get("first_step_s"))
                m["peak_gib"].append(r["peak_gib"])
                m.setdefault("losses", r["losses"])
                m.setdefault("flce_plan", r.get("flce_plan"))
            else:
                m["errors"].append(r.get("error", "?"))
        for m in row["methods"].values():
            m["tps"] = statistics.fmean(m["tokens_per_s"]) if m["tokens_per_s"] else None
            peaks = [p for p in m["peak_gib"] if p is not None]
            m["peak"] = max(peaks) if peaks else None
        judge(row)
        rows.append(row)
    return rows


def judge(row: dict) -> None:
    ms = row["methods"]
    tps = {k: v["tps"] for k, v in ms.items()}
    peak = {k: v["peak"] for k, v in ms.items()}
    ref = ms.get("hf", {}).get("losses")
    for m in ms.values():
        if ref and m.get("losses"):
            m["max_dloss_vs_hf"] = max(abs(a - b) for a, b in zip(m["losses"], ref, strict=False))
    ratio = lambda a, b: tps[a] / tps[b] if tps.get(a) and tps.get(b) else None  # noqa: E731
    row["ratios"] = {
        "ours/hf": ratio("ours", "hf"),
        "ours/liger": ratio("ours", "liger"),
        "tp/hf": ratio("ours_tp", "hf"),
        "tp/liger": ratio("ours_tp", "liger"),
        "oc/hc": ratio("ours_compile", "hf_compile"),
    }
    row["recipes"] = recipe_ratios(tps)
    r = row["ratios"]
    extra = (
        (peak["ours"] - peak["liger"])
        if peak.get("ours") is not None and peak.get("liger") is not None
        else None
    )
    row["targets"] = {
        ">=1.0x HF": None if r["ours/hf"] is None else r["ours/hf"] >= 1.0,
        ">=1.1x liger": None if r["ours/liger"] is None else r["ours/liger"] >= 1.1,
        "peak<=liger+0.25": None if extra is None else extra <= 0.25,
        "compiled>=1.0x": None if r["oc/hc"] is None else r["oc/hc"] >= 1.0,
    }


def recipe_ratios(tps: dict) -> dict:
    """Per compile recipe measured: ours against HF compiled the same way, and against ours eager."""
    out = {}
    for suffix in RECIPES:
        ours, hf = tps.get(f"ours{suffix}"), tps.get(f"hf{suffix}")
        if ours:
            out[f"ours{suffix}/hf{suffix}"] = ours / hf if hf else None
            out[f"ours{suffix}/ours"] = ours / tps["ours"] if tps.get("ours") else None
    return out


def kfmt(x) -> str:
    return None if x is None else f"{x / 1000:.1f}k"


def verdicts(targets: dict) -> str:
    return " ".join(f"{k}:{'?' if v is None else 'met' if v else 'MISSED'}" for k, v in targets.items())


def print_runs(runs: list[dict], meta: dict) -> None:
    """What the processes cost, the FLCE plans and the failed runs."""
    ok = [r for r in runs if r.get("ok")]
    if ok:
        over = [r["wall_s"] - sum(r["step_s"]) for r in ok]
        print(
            f"\nper process: wall {statistics.median([r['wall_s'] for r in ok]):.1f} s median, of which "
            f"{statistics.median(over):.1f} s outside the training steps (imports "
            f"{statistics.median([r['import_s'] for r in ok]):.1f}, build "
            f"{statistics.median([r['build_s'] for r in ok]):.1f}, apply "
            f"{statistics.median([r['apply_s'] for r in ok]):.1f}); total {meta['wall_s']:.0f} s for {len(runs)} "
            f"processes ({'spawned' if meta['spawn'] else 'forked'})"
        )
    plans = {(r["model"], r["tokens"], r["method"]): r.get("flce_plan") for r in ok if r.get("flce_plan")}
    for (model, tokens, method), plan in sorted(plans.items()):
        print(f"  FLCE plan {model} T{tokens} {method}: {plan}")
    for r in runs:
        if not r.get("ok"):
            print(
                f"  ERROR {r['model']} L{r['layers']} T{r['tokens']} {r['method']} r{r['repeat']}: "
                f"{r.get('error', '')[:140]}"
            )


RATIOS = ("ours/hf", "ours/liger", "tp/hf", "tp/liger", "oc/hc")


def print_table(rows: list[dict], runs: list[dict], meta: dict) -> None:
    methods = meta["methods"]
    print_runs(runs, meta)
    print(
        f"\ntok/s: mean of {meta['repeats']} process(es), median step after {meta['warmup']} of {meta['steps']}; "
        f"peak: max allocated GiB; targets: {TARGETS}"
    )
    cols = [("model", ""), ("L", "d"), ("tokens", "d")] + [(m, ">") for m in methods]
    cols += [(r.replace("liger", "lk"), ".3f") for r in RATIOS]
    cols += [(f"GiB {m}", ".2f") for m in methods] + [("max|dL|", ".1e"), ("targets", "")]
    lines = []
    for row in rows:
        ms = row["methods"]
        dl = max((m.get("max_dloss_vs_hf", 0.0) for m in ms.values()), default=None)
        lines.append(
            [row["model"], row["layers"], row["tokens"]]
            + [kfmt(ms.get(m, {}).get("tps")) for m in methods]
            + [row["ratios"][r] for r in RATIOS]
            + [ms.get(m, {}).get("peak") for m in methods]
            + [dl, verdicts(row["targets"])]
        )
    harness.print_table(cols, lines, meta["title"])
    for row in rows:
        for name, m in row["methods"].items():
            if is_compiled(name) and m["compile_s"]:
                firsts = [x for x in m["first_step_s"] if x is not None]
                print(
                    f"  compile {row['model']} L{row['layers']} T{row['tokens']} {name}: "
                    f"{statistics.fmean(m['compile_s']):.1f} s beyond the warm-up steps' median time, first step "
                    f"{statistics.fmean(firsts) if firsts else float('nan'):.1f} s"
                )
        for name, x in row.get("recipes", {}).items():
            print(
                f"  {row['model']} L{row['layers']} T{row['tokens']} {name}: {'-' if x is None else f'{x:.3f}'}"
            )
    flat = [v for row in rows for v in row["targets"].values()]
    print(
        f"targets: {sum(1 for v in flat if v)} met, {sum(1 for v in flat if v is False)} MISSED, "
        f"{sum(1 for v in flat if v is None)} not evaluable; json: {meta['json']}; png: {meta['png']}"
    )


def plot(rows: list[dict], methods: list[str], path: Path) -> str:
    def draw(plt):
        n = len(rows)
        grid = math.ceil(n / 4)
        fig = plt.figure(figsize=(18, 5 + 3.2 * grid))
        gs = fig.add_gridspec(1 + grid, 4)
        labels = [f"{r['model']}\nL{r['layers']} T{r['tokens']}" for r in rows]
        width = 0.8 / max(len(methods), 1)
        for j, (key, title) in enumerate((("tps", "tokens/s"), ("peak", "peak allocated GiB"))):
            ax = fig.add_subplot(gs[0, 2 * j : 2 * j + 2])
            for k, m in enumerate(methods):
                vals = [row["methods"].get(m, {}).get(key) or 0.0 for row in rows]
                ax.bar([i + k * width for i in range(n)], vals, width, label=m)
            ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(n)], labels, fontsize=7)
            ax.set_title(title)
            ax.legend(fontsize=7)
        for i, row in enumerate(rows):
            ax = fig.add_subplot(gs[1 + i // 4, i % 4])
            for m in methods:
                losses = row["methods"].get(m, {}).get("losses")
                if losses:
                    ax.plot(range(1, len(losses) + 1), losses, marker=".", label=m)
            ax.set_title(labels[i].replace("\n", " "), fontsize=8)
            ax.set_xlabel("step", fontsize=7)
            ax.legend(fontsize=6)
        return fig

    return harness.plot(draw, path)


def results_of(args, runs: list[dict], bench: str = "e2e", tag: str = "") -> harness.Results:
    """The run's result files, with the device its processes reported (the driver never starts CUDA)."""
    device = next((r["env"].get("device") for r in runs if r.get("env", {}).get("device")), "cpu")
    return harness.Results(bench, args.out, env=harness.capture_env(device), tag=tag)


def main(argv=None) -> int:
    args = parse(argv)
    if args.child is not None:
        child_main(json.loads(args.child), args.result)
        return 0
    start = time.perf_counter()
    runs = drive(args)
    rows = summarise(runs)
    methods = args.methods.split(",")
    results = results_of(args, runs)
    env = {**next((r["env"] for r in runs if "env" in r), {}), **results.env}
    title = (
        f"training step (fwd, bwd, AdamW {args.optimizer}), {'fp32 CPU smoke' if args.cpu_smoke else 'bf16'}, "
        f"{'SDPA (gpt_oss: eager)' if 'gpt_oss' in args.models.split(',') else 'SDPA'}, batch "
        f"{args.batch}; {env.get('device', 'cpu')}, torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}"
    )
    meta = {
        "title": title,
        "methods": methods,
        "repeats": args.repeats,
        "steps": args.steps,
        "warmup": args.warmup,
        "spawn": args.spawn,
        "wall_s": time.perf_counter() - start,
        "env": env,
        "args": vars(args),
    }
    meta["png"] = plot(rows, methods, results.path("png"))
    meta["json"] = str(results.path("json"))
    for row in rows:
        case = f"{row['model']} L{row['layers']} T{row['tokens']}"
        for name, m in row["methods"].items():
            results.add(case, name, "tokens_per_s", m["tps"])
            results.add(case, name, "peak_gib", m["peak"])
    results.write({"meta": meta, "rows": rows, "runs": runs})
    print_table(rows, runs, meta)
    return 0 if any(r.get("ok") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
