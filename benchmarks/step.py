"""Training-step benchmark at realistic depth: real model configs, one process per run.

Rows (model x shape): Llama-3.2-1B (16 layers, tied embeddings, llama3 RoPE scaling), Qwen3-1.7B (28 layers,
QK-norm, tied), Gemma-2-2B (26 layers, GeGLU, attention and final-logit softcap, sliding window 4096 on every
other layer, tied; flex attention: transformers has no SDPA path with softcap and eager attention does not fit
16384 tokens), Llama-3-8B cut to 8 of its 32 layers, and the MoE cuts of bench_e2e at 4 layers (`qwen3_moe`
Qwen3-30B-A3B, `mixtral` Mixtral-8x7B, `gpt_oss` GPT-OSS-20B with flex attention: its sinks have no SDPA path
and eager attention does not fit 16384 tokens) and Llama-4-Scout cut to 2 of its 48 MoE layers (`llama4_scout`:
16 experts, top-1, a shared expert; transformers' block runs every expert on every token); shapes 2 x 4096 and
1 x 16384 tokens. The configs are written
here (the values of the models' config.json on the Hub), the weights random (seed 0), bf16, built on the GPU.
Methods, each run in its own process (bench_e2e's process machinery: forked from a driver that imported torch
and transformers once, or --spawn): `hf` (unpatched), `hf_compile` (torch.compile(model)), `liger` (the
reference library's apply_liger_kernel_to_<family>(model=...), a benchmark-only peer), `ours`
(liger_registry.apply(model)), `ours_compile`; plus `hf_noise`, once per row: HF with every weight moved by
about half a bf16 rounding step, the reference for what rounding-level differences do to the loss curve
(`--noise-draws N`: N such runs, each its own perturbation); and, on request, `hf_fp32`, once per row: HF on the
same initial weights upcast to fp32 and trained in fp32, the exact curve each method's distance is reported from.
Compile recipes beyond torch.compile(model), by name for hf and ours (opt in; bench_e2e.RECIPES):
`_compile_regional` (each decoder layer compiled), `_compile_autotune` (max-autotune-no-cudagraphs),
`_compile_cudagraphs` (reduce-overhead); the first step's time is recorded with the compile time.
The methods of a row run next to each other in a rotated order, rows and repeats interleaved (bench_e2e's order).

Per run: tokens/s of the median step after the warm-up steps, peak allocated GiB, model FLOPs utilisation
(6 x matmul parameters + causal/sliding-window attention, per token, over the step time, against the bf16
torch.mm rate of a short probe at the start of the same run), the loss of every step, compile time (the warm-up
steps' time beyond as many median steps) apart. Loss check per row: the largest |loss - HF's| over the steps
of every method, against HF's noise band (the spread between HF's repeats and the hf_noise run's distance). Table
printed last (the targets evaluated on the dense rows); JSON (rewritten after every process, so a killed run
keeps what it measured) and two PNGs (tokens/s, MFU, peak per row and method; loss curves) under --out. Runs split over several device calls (--models/--shapes/--rows/--methods, --tag) are
joined with --merge (each run keeps the mm rate of its own call). TRITON_CACHE_AUTOTUNING=1 unless set: autotuned
kernels (ours, the peer's MoE experts) tune once per shape and call, not once per process. A SIGTERM (gpu_run.sh's
per-part limit) ends the running process and prints the table of what ran.

Usage: python -m benchmarks step [--models llama3_2_1b,qwen3_1_7b] [--shapes 2x4096,1x16384]
                                 [--methods hf,liger,ours] [--repeats 2] [--budget-s 540] [--tag dense]
       python -m benchmarks step --merge a/bench_step-dense_h100_DATE.json b/bench_step-moe_h100_DATE.json
       python -m benchmarks step --cpu-smoke    # tiny dims on CPU, hf and ours: checks the script
       python -m benchmarks step --models llama3_2_1b --shapes 2x4096 --no-noise --tag compile \
           --methods ours,hf_compile,ours_compile,hf_compile_regional,ours_compile_regional,ours_compile_autotune
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import e2e, harness

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
MODELS = {
    "llama3_2_1b": dict(  # meta-llama/Llama-3.2-1B
        model_type="llama",
        num_hidden_layers=16,
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
    "qwen3_1_7b": dict(  # Qwen/Qwen3-1.7B
        model_type="qwen3",
        num_hidden_layers=28,
        hidden_size=2048,
        intermediate_size=6144,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    ),
    "gemma2_2b": dict(  # google/gemma-2-2b
        model_type="gemma2",
        num_hidden_layers=26,
        hidden_size=2304,
        intermediate_size=9216,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        vocab_size=256000,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=256,
        sliding_window=4096,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "llama3_8b": dict(  # meta-llama/Meta-Llama-3-8B
        model_type="llama",
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
    # bench_e2e's MoE shapes at their real depth (cut below); untied heads as on the Hub
    "qwen3_moe": {**e2e.MODELS["qwen3_moe"], "num_hidden_layers": 48, "tie_word_embeddings": False},
    "mixtral": {**e2e.MODELS["mixtral"], "num_hidden_layers": 32, "tie_word_embeddings": False},
    "gpt_oss": {**e2e.MODELS["gpt_oss"], "num_hidden_layers": 24, "tie_word_embeddings": False},
    "llama4_scout": dict(  # meta-llama/Llama-4-Scout-17B-16E's text_config: every layer a MoE block
        model_type="llama4_text",
        num_hidden_layers=48,
        hidden_size=5120,
        intermediate_size=8192,
        intermediate_size_mlp=16384,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        num_local_experts=16,
        num_experts_per_tok=1,
        interleave_moe_layer_step=1,
        vocab_size=202048,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
}
DENSE = ("llama3_2_1b", "qwen3_1_7b", "gemma2_2b", "llama3_8b")
# layers run; the others at full depth (Llama-4-Scout: 2 of 48, ~6.3B parameters, AdamW states in fp32: an H200)
CUT = {"llama3_8b": 8, "qwen3_moe": 4, "mixtral": 4, "gpt_oss": 4, "llama4_scout": 2}
ATTN = {"gemma2_2b": "flex_attention", "gpt_oss": "flex_attention"}  # default: sdpa
PEER_APPLY = {
    "llama3_2_1b": "apply_liger_kernel_to_llama",
    "qwen3_1_7b": "apply_liger_kernel_to_qwen3",
    "gemma2_2b": "apply_liger_kernel_to_gemma2",
    "llama3_8b": "apply_liger_kernel_to_llama",
    **{m: e2e.PEER_APPLY[m] for m in ("qwen3_moe", "mixtral", "gpt_oss")},
    "llama4_scout": "apply_liger_kernel_to_llama4",
}
SHAPES = ("2x4096", "1x16384")
SMOKE_SHAPES = ("2x32",)
SMOKE_MODELS = ("llama3_2_1b", "gemma2_2b", "qwen3_moe", "llama4_scout")
SMOKE_EXTRA = {  # a window < seq; Llama 4's MoE dims
    "gemma2_2b": dict(sliding_window=16),
    "gpt_oss": dict(sliding_window=16),
    "llama4_scout": dict(num_local_experts=4, intermediate_size_mlp=128),
}
METHODS = ("hf", "hf_compile", "liger", "ours", "ours_compile")
CPU_METHODS = ("hf", "ours")
NOISE = "hf_noise"
NOISE_SEED = 99  # draw r of hf_noise: seed NOISE_SEED + r
# HF on the same bf16 initial weights upcast to fp32, trained in fp32 (TF32 off), once per row: which curve is
# nearer the exact one where a method leaves HF's noise band (opt in: --methods ...,hf_fp32)
FP32_REF = "hf_fp32"
# opt-in methods: not in the default list (the fp32 reference; ours with the throughput policy's 512 MiB head buffer;
# the compile recipes other than torch.compile(model): bench_e2e.RECIPES)
OPT_IN = (FP32_REF, "ours_tp", *e2e.OPT_IN)
PROBE = "probe"
NOISE_SCALE = (
    2.0**-9
)  # relative; about half of bf16's rounding step, so a fraction of the weights move one ulp
EST_S = {False: 30.0, True: 150.0}  # a process's wall before any of its kind ran (eager, compiled)
TARGETS = {  # dense rows
    "ours>=1.35x hf": ("ours", "hf", 1.35),
    "ours>=1.15x liger": ("ours", "liger", 1.15),
    "oc>=1.10x hc": ("ours_compile", "hf_compile", 1.10),
}
FLOP_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "vocab_size",
    "sliding_window",
    "layer_types",
    "model_type",
)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=None, help="comma list of " + ", ".join(MODELS) + " (default: all)")
    p.add_argument("--shapes", default=None, help="comma list of BATCHxSEQ (default 2x4096,1x16384)")
    p.add_argument("--rows", default=None, help="comma list of MODEL:BATCHxSEQ, instead of models x shapes")
    p.add_argument(
        "--methods",
        default=None,
        help="comma list of " + ", ".join((*METHODS, *OPT_IN)) + f" (default: all but {', '.join(OPT_IN)})",
    )
    p.add_argument("--no-noise", dest="noise", action="store_false", help="no hf_noise run per row")
    p.add_argument(
        "--noise-draws",
        type=int,
        default=1,
        help="hf_noise runs per row, each its own perturbation (one per repeat from 0): a wider sample of the band "
        "where the loss curve is chaotic",
    )
    p.add_argument("--layers", default="", help="MODEL=N,... overrides the depth run")
    p.add_argument("--attn", default="", help="MODEL=IMPL,... overrides the attention implementation")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--compile-repeats",
        type=int,
        default=None,
        help="repeats of the compiled methods (default --repeats)",
    )
    p.add_argument(
        "--compile",
        choices=("model", "layers"),
        default="model",
        help="torch.compile(model) (what Trainer's torch_compile does), or each decoder layer apart "
        "(regional compilation: one layer's compile time, the head stays eager)",
    )
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (see bench_e2e)")
    p.add_argument("--optimizer", choices=("fused", "foreach"), default="fused")
    p.add_argument("--timeout-s", type=float, default=240.0, help="per eager process; compiled: twice")
    p.add_argument("--budget-s", type=float, default=540.0, help="start no process that would end after this")
    p.add_argument("--spawn", action="store_true", help="start every process from scratch instead of forking")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny dims on CPU, 3 steps, hf and ours")
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the compiled methods (the CPU smoke checks the recipes with aot_eager)",
    )
    p.add_argument("--tag", default="", help="part of the output files' names (bench_step-TAG_DEVICE_DATE.*)")
    harness.add_out_arg(p)
    p.add_argument("--merge", nargs="+", default=None, help="join the runs of these JSONs; runs nothing")
    p.add_argument("--markdown", action="store_true", help="also print the throughput table as Markdown")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.models = args.models or ",".join(SMOKE_MODELS)
        args.shapes = args.shapes or ",".join(SMOKE_SHAPES)
        args.methods = args.methods or ",".join(CPU_METHODS)
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    args.models = args.models or ",".join(MODELS)
    args.shapes = args.shapes or ",".join(SHAPES)
    args.methods = args.methods or ",".join(METHODS)
    if args.compile_repeats is None:
        args.compile_repeats = args.repeats
    return args


def pairs(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if item)


def shape_of(text: str) -> tuple[int, int]:
    batch, seq = text.lower().split("x")
    return int(batch), int(seq)


def rows_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.rows:
        rows = [tuple(r.split(":", 1)) for r in args.rows.split(",")]
    else:
        rows = [(m, s) for m in args.models.split(",") for s in args.shapes.split(",")]
    for model, shape in rows:
        if model not in MODELS:
            raise SystemExit(f"bench_step: unknown model {model!r} (known: {', '.join(MODELS)})")
        shape_of(shape)
    return rows


def repeats_of(method: str, args: argparse.Namespace) -> int:
    """How many repeats run a method: compiled ones --compile-repeats, the fp32 reference one, the rest --repeats."""
    if e2e.is_compiled(method):
        return args.compile_repeats
    return 1 if method == FP32_REF else args.repeats


def jobs_of(args: argparse.Namespace) -> list[dict]:
    """Every process to run, in order: per repeat, per row, its methods in a rotated order; hf_noise in repeats
    0 .. noise_draws - 1 (draw r perturbs with seed NOISE_SEED + r)."""
    methods = args.methods.split(",")
    unknown = set(methods) - set(METHODS) - {NOISE, *OPT_IN}
    if unknown:
        raise SystemExit(
            f"bench_step: unknown methods {sorted(unknown)} (known: {', '.join((*METHODS, *OPT_IN))})"
        )
    layers, attn = pairs(args.layers), pairs(args.attn)
    jobs = []
    if args.noise_draws < 1:
        raise SystemExit("bench_step: --noise-draws must be at least 1 (use --no-noise for none)")
    for r in range(max(args.repeats, args.compile_repeats, args.noise_draws if args.noise else 0)):
        for i, (model, shape) in enumerate(rows_of(args)):
            here = [m for m in methods if m != NOISE and r < repeats_of(m, args)]
            if r < args.noise_draws and args.noise and "hf" in methods:
                here.append(NOISE)
            if not here:
                continue
            k = (r + i) % len(here)
            batch, seq = shape_of(shape)
            depth = 2 if args.cpu_smoke else CUT.get(model, MODELS[model]["num_hidden_layers"])
            default_attn = "eager" if args.cpu_smoke else ATTN.get(model, "sdpa")
            for method in here[k:] + here[:k]:
                jobs.append(
                    dict(
                        model=model,
                        shape=shape,
                        batch=batch,
                        seq=seq,
                        tokens=batch * seq,
                        layers=int(layers.get(model, depth)),
                        attn=attn.get(model, default_attn),
                        method=method,
                        repeat=r,
                        steps=args.steps,
                        warmup=args.warmup,
                        lr=args.lr,
                        optimizer=args.optimizer,
                        compile=args.compile,
                        compile_backend=args.compile_backend,
                        smoke=args.cpu_smoke,
                        peer_apply=PEER_APPLY[model],
                        timeout_s=args.timeout_s * (2 if e2e.is_compiled(method) else 1),
                    )
                )
    return jobs


# --- model FLOPs


def mean_keys(seq: int, window: int | None) -> float:
    """Keys each query attends to, averaged over the positions of a causal sequence (window: the last `window`)."""
    if not window or window >= seq:
        return (seq + 1) / 2
    return (window * (window + 1) / 2 + (seq - window) * window) / seq


def step_flops(d: dict, batch: int, seq: int) -> dict:
    """Model FLOPs of one training step (forward + backward = 3 x forward; no recomputation counted): 6 x the
    matmul parameters a token meets (attention projections, the MLP or its top-k experts and router, the head)
    per token, plus QK^T and PV over the keys each query sees (causal, sliding window where a layer has one)."""
    h, n_layers = d["hidden_size"], d["num_hidden_layers"]
    heads, kv = d["num_attention_heads"], d["num_key_value_heads"]
    hd = d.get("head_dim") or h // heads
    proj = h * hd * (2 * heads + 2 * kv)
    experts = d.get("num_experts") or d.get("num_local_experts")
    if experts:
        inter = d.get("moe_intermediate_size") or d["intermediate_size"]
        mlp = d["num_experts_per_tok"] * 3 * h * inter + h * experts
        if d.get("model_type") == "llama4_text":  # Llama4TextMoe's shared expert, beside the routed ones
            mlp += 3 * h * inter
    else:
        mlp = 3 * h * d["intermediate_size"]
    params = n_layers * (proj + mlp) + h * d["vocab_size"]
    tokens = batch * seq
    types = list(d.get("layer_types") or [])[:n_layers]
    types += ["full_attention"] * (n_layers - len(types))
    keys = sum(mean_keys(seq, d.get("sliding_window") if t == "sliding_attention" else None) for t in types)
    matmul, attention = 6.0 * params * tokens, 12.0 * heads * hd * keys * tokens
    return {"matmul_params": params, "matmul": matmul, "attention": attention, "total": matmul + attention}


# --- one run (its own process)


def mm_probe(device: str) -> dict:
    """The dense matmul rate of this device: the median of 20 square torch.mm (bf16 8192 on CUDA)."""
    import torch

    cuda = device == "cuda"
    n, dtype = (8192, torch.bfloat16) if cuda else (256, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty_like(a)
    timing = harness.measure({"mm": lambda: torch.mm(a, b, out=c)}, warmup=3, repeats=20, cuda=cuda)
    rate = 2 * n**3 / (timing["mm"].median * 1e-3)
    return {"mm_tflops": rate / 1e12, "mm": f"{n}^3 {str(dtype).removeprefix('torch.')}"}


def build_model(job: dict, device: str, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dims = dict(MODELS[job["model"]])
    model_type = dims.pop("model_type")
    dims.pop("attn_implementation", None)
    dims["num_hidden_layers"] = job["layers"]
    if job["smoke"]:
        dims.update(
            e2e.SMOKE_DIMS, **e2e.SMOKE_MOE.get(job["model"], {}), **SMOKE_EXTRA.get(job["model"], {})
        )
    config = AutoConfig.for_model(model_type, use_cache=False, **dims)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=job["attn"])
    dtypes = {p.dtype for p in model.parameters()}
    quant = getattr(model, "hf_quantizer", None) or getattr(config, "quantization_config", None)
    if dtypes != {dtype} or quant is not None:
        raise RuntimeError(f"{job['model']}: parameters {sorted(map(str, dtypes))}, quantization {quant}")
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    if tied != bool(dims.get("tie_word_embeddings")):
        raise RuntimeError(f"{job['model']}: head tied {tied}, config says {dims.get('tie_word_embeddings')}")
    return model.train(), config


def perturb(model, scale: float = NOISE_SCALE, seed: int = NOISE_SEED) -> None:
    """Every weight times (1 + scale * N(0, 1)), rounded back to its dtype: a model as close to the original as
    another bf16 rounding of it."""
    import torch

    gens: dict = {}
    with torch.no_grad():
        for p in model.parameters():
            # drawn where the weight lives: billions of normals on the host would take half a minute
            gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
            noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
            p.copy_((p.float() * (1 + scale * noise)).to(p.dtype))


def compile_model(model, job: dict):
    """The method's recipe (bench_e2e.RECIPES); ``--compile layers`` makes the plain `_compile` methods regional."""
    method = job["method"]
    how = job.get("compile", "model") if e2e.recipe_of(method)[1] == e2e.RECIPES[e2e.COMPILED] else None
    return e2e.compile_model(model, method, job.get("compile_backend", "inductor"), how=how)


def run_job(job: dict) -> dict:
    t0 = time.perf_counter()
    import torch

    device = "cpu" if job["smoke"] else "cuda"
    dtype = torch.float32 if job["smoke"] else torch.bfloat16
    out: dict = {"import_s": time.perf_counter() - t0}
    try:
        if job["method"] == PROBE:
            out.update(mm_probe(device))
        else:
            t = time.perf_counter()
            model, config = build_model(job, device, dtype)
            out["build_s"] = time.perf_counter() - t
            out["flops"] = step_flops(
                {k: getattr(config, k, None) for k in FLOP_KEYS}, job["batch"], job["seq"]
            )
            out["params"] = sum(p.numel() for p in model.parameters())
            if getattr(config, "_experts_implementation", None):
                out["hf_experts_implementation"] = config._experts_implementation
            t = time.perf_counter()
            if job["method"] == NOISE:
                perturb(model, seed=NOISE_SEED + job["repeat"])
            if job["method"] == FP32_REF:
                model = model.float()
            unpatched = job["method"] in (NOISE, FP32_REF)
            out.update(e2e.patch({**job, "method": "hf" if unpatched else job["method"]}, model))
            if e2e.is_compiled(job["method"]):
                model = compile_model(model, job)
            out["apply_s"] = time.perf_counter() - t
            out.update(e2e.train({**job, "dtype": dtype}, model, device))
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - an OOM or a missing peer is a result of this run
        harness.record_failure(out, exc)
    import transformers

    out["env"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if job["method"].startswith("liger"):
        try:
            from importlib.metadata import version

            out["env"]["liger_kernel"] = version("liger-kernel")
        except Exception:  # noqa: BLE001
            pass
    if device == "cuda" and out["ok"]:
        out["env"]["device"] = torch.cuda.get_device_name()
    return out


def child_main(job: dict, result: str) -> None:
    e2e.child_main(job, result, run=run_job)


# --- the driver


class Stopped(Exception):
    pass


def on_term(signum, frame):
    raise Stopped(f"signal {signum}")


def preimport(smoke: bool) -> None:
    e2e.preimport(smoke)
    import transformers.integrations.flex_attention  # noqa: F401
    import transformers.models.gemma2.modeling_gemma2  # noqa: F401


def predicted_s(job: dict, runs: list[dict]) -> float:
    """What the job will take: its row and method's last process (caches warm by then), else the longest of its
    row's processes of the same kind, else of any row, else EST_S."""
    compiled = e2e.is_compiled(job["method"])
    runs = [r for r in runs if "wall_s" in r]  # processes that ran
    same = [
        r["wall_s"]
        for r in runs
        if (r["model"], r["shape"], r["method"]) == (job["model"], job["shape"], job["method"])
    ]
    if same:
        return same[-1]
    kind = [r for r in runs if r["method"] != PROBE and e2e.is_compiled(r["method"]) == compiled]
    row = [r["wall_s"] for r in kind if (r["model"], r["shape"]) == (job["model"], job["shape"])]
    return max(row or [r["wall_s"] for r in kind] or [EST_S[compiled]])


def describe(r: dict, rate: float | None) -> str:
    if not r.get("ok"):
        return r.get("error", "")[:150]
    if r["method"] == PROBE:
        return f"{r['mm_tflops']:.4g} TFLOP/s ({r['mm']})"
    mfu = mfu_of(r, rate)
    return (
        f"{r['tokens_per_s']:,.0f} tok/s, MFU {'-' if mfu is None else f'{mfu:.1%}'}, peak "
        f"{r['peak_gib'] or 0:.2f} GiB, loss {r['losses'][-1]:.4f}, compile {r['compile_s']:.1f} s"
    )


def drive(args: argparse.Namespace, save, start: float) -> list[dict]:
    """Every job in its own process, none started that would end after --budget-s from ``start``."""
    if not args.spawn:
        preimport(args.cpu_smoke)
    probe = dict(model="-", shape="-", method=PROBE, repeat=0, smoke=args.cpu_smoke, timeout_s=60.0)
    jobs = [probe, *jobs_of(args)]
    runs, rate = [], None
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, job in enumerate(jobs):
                elapsed = time.perf_counter() - start
                if i and elapsed + predicted_s(job, runs) > args.budget_s:
                    runs.append(
                        {**job, "ok": False, "error": f"not run: time budget {args.budget_s:.0f} s spent"}
                    )
                    continue
                r = e2e.launch(job, args, Path(tmp), i, child=child_main, module="benchmarks.step")
                if not args.spawn and not r.get("ok") and e2e.fork_broke_cuda(r.get("error", "")):
                    print(f"step: CUDA does not start in a forked process ({r['error'][:120]}); spawning")
                    args.spawn = True
                    r = e2e.launch(job, args, Path(tmp), i, child=child_main, module="benchmarks.step")
                if job["method"] == PROBE:
                    rate = r.get("mm_tflops")
                r["mm_tflops"] = rate
                runs.append(r)
                print(
                    f"[{i}/{len(jobs) - 1} {elapsed:4.0f}s] {job['model']} {job['shape']} {job['method']:<12} "
                    f"r{job['repeat']}: {describe(r, rate)} (process {r['wall_s']:.1f} s)",
                    flush=True,
                )
                save(runs, partial=True)
    except Stopped as exc:
        import multiprocessing

        for proc in multiprocessing.active_children():
            proc.kill()
            proc.join()
        done = len(runs)
        runs += [{**job, "ok": False, "error": f"not run: stopped ({exc})"} for job in jobs[done:]]
        print(f"step: stopped by {exc} after {done} of {len(jobs)} processes; summarising what ran")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return runs


# --- aggregation


def mfu_of(r: dict, rate: float | None) -> float | None:
    if not (r.get("ok") and rate and r.get("flops")):
        return None
    return r["flops"]["total"] / r["median_step_s"] / (rate * 1e12)


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (model, shape): per method the median tok/s and MFU over its processes, max peak, the loss
    curves; the loss check and the targets."""
    rows = []
    measured = [r for r in runs if r["method"] != PROBE]
    for model, shape in dict.fromkeys((r["model"], r["shape"]) for r in measured):
        row = {"model": model, "shape": shape, "methods": {}}
        for r in measured:
            if (r["model"], r["shape"]) != (model, shape):
                continue
            row.setdefault("layers", r.get("layers"))
            row.setdefault("attn", r.get("attn"))
            m = row["methods"].setdefault(
                r["method"],
                {
                    "tokens_per_s": [],
                    "mfu": [],
                    "peak_gib": [],
                    "compile_s": [],
                    "first_step_s": [],
                    "curves": [],
                    "errors": [],
                },
            )
            if r.get("ok"):
                m["tokens_per_s"].append(r["tokens_per_s"])
                m["mfu"].append(mfu_of(r, r.get("mm_tflops")))
                m["peak_gib"].append(r["peak_gib"])
                m["compile_s"].append(r.get("compile_s", 0.0))
                m["first_step_s"].append(r.get("first_step_s"))
                m["curves"].append(r["losses"])
                row.setdefault("flops", r.get("flops"))
            else:
                m["errors"].append(r.get("error", "?"))
        for m in row["methods"].values():
            m["tps"] = statistics.median(m["tokens_per_s"]) if m["tokens_per_s"] else None
            mfus = [x for x in m["mfu"] if x is not None]
            m["mfu_median"] = statistics.median(mfus) if mfus else None
            peaks = [p for p in m["peak_gib"] if p is not None]
            m["peak"] = max(peaks) if peaks else None
            m["compile"] = statistics.median(m["compile_s"]) if m["compile_s"] else None
            firsts = [x for x in m["first_step_s"] if x is not None]
            m["first_step"] = statistics.median(firsts) if firsts else None
        loss_check(row)
        judge(row)
        rows.append(row)
    return rows


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=False))


def loss_check(row: dict) -> None:
    """HF's noise band: the spread of its repeats around its first curve and the hf_noise curve's distance from
    it, the larger of the two over the steps; every method's largest distance from HF's first curve against it."""
    ms = row["methods"]
    hf = ms.get("hf", {}).get("curves") or []
    check = {"band": None, "band_repeats": None, "band_noise": None, "dev": {}, "within": {}, "fp32_dev": {}}
    row["loss_check"] = check
    if not hf:
        return
    ref = hf[0]
    if len(hf) > 1:
        check["band_repeats"] = max(max_gap(c, ref) for c in hf[1:])
    if ms.get(NOISE, {}).get("curves"):
        check["band_noise"] = max(max_gap(c, ref) for c in ms[NOISE]["curves"])
    bands = [b for b in (check["band_repeats"], check["band_noise"]) if b is not None]
    check["band"] = max(bands) if bands else None
    exact = (ms.get(FP32_REF, {}).get("curves") or [None])[0]
    for name, m in ms.items():
        if exact is not None and name != FP32_REF and m["curves"]:
            check["fp32_dev"][name] = max(max_gap(c, exact) for c in m["curves"])
        curves = m["curves"][1:] if name == "hf" else m["curves"]
        if name in (NOISE, FP32_REF) or not curves:
            continue
        check["dev"][name] = max(max_gap(c, ref) for c in curves)
        check["within"][name] = None if not check["band"] else check["dev"][name] <= check["band"]


def judge(row: dict) -> None:
    ms = row["methods"]
    tps = {k: v["tps"] for k, v in ms.items()}
    ratio = lambda a, b: tps[a] / tps[b] if tps.get(a) and tps.get(b) else None  # noqa: E731
    row["ratios"] = {
        "ours/hf": ratio("ours", "hf"),
        "ours/liger": ratio("ours", "liger"),
        "oc/hc": ratio("ours_compile", "hf_compile"),
        "tp/liger": ratio("ours_tp", "liger"),
    }
    row["recipes"] = e2e.recipe_ratios(tps)
    row["targets"] = {}
    if row["model"] not in DENSE:  # the targets are the dense rows'; MoE rows are reported
        return
    for label, (a, b, bar) in TARGETS.items():
        x = ratio(a, b)
        row["targets"][label] = None if x is None else x >= bar
    peak = {k: v["peak"] for k, v in ms.items()}
    ok = peak.get("ours") is not None and peak.get("liger") is not None
    row["targets"]["peak<=liger"] = (peak["ours"] <= peak["liger"] + 0.01) if ok else None


# --- report


def kfmt(x) -> str | None:
    return None if x is None else f"{x / 1000:.1f}k"


def ffmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def verdicts(d: dict) -> str:
    return " ".join(f"{k}:{'?' if v is None else 'met' if v else 'MISSED'}" for k, v in d.items())


def label_of(row: dict) -> str:
    depth = row.get("layers")
    full = MODELS[row["model"]]["num_hidden_layers"]
    return f"{row['model']} L{depth}{'' if depth == full else f'/{full}'} {row['shape']}"


def missing(x: dict) -> str:
    """A cell without a number: "OOM" (every process of the method ran out of GPU memory), "error" (some other
    failure, listed under the table), "-" (not run)."""
    errors = x.get("errors") or []
    if not errors:
        return "-"
    return "OOM" if all("OutOfMemoryError" in e for e in errors) else "error"


def value_cell(x: dict, key: str, fmt) -> str:
    return fmt(x[key]) if x.get(key) is not None else missing(x)


def table_lines(rows: list[dict], methods: list[str], markdown: bool = False) -> list[str]:
    """The throughput table: tok/s, MFU and peak per method, the ratios and targets."""
    if markdown:
        cols = [("row", "")] + [(f"{m} tok/s (MFU, GiB)", ">") for m in methods]
        cols += [("ours/hf", ".2f"), ("ours/liger", ".2f"), ("oc/hc", ".2f")]
        lines = []
        for row in rows:
            ms, r = row["methods"], row["ratios"]
            cells = [
                missing(x)
                if (x := ms.get(m, {})).get("tps") is None
                else f"{kfmt(x['tps'])} ({ffmt(x.get('mfu_median'), '.0%')}, {ffmt(x.get('peak'), '.1f')})"
                for m in methods
            ]
            lines.append([label_of(row), *cells, r["ours/hf"], r["ours/liger"], r["oc/hc"]])
        return harness.table(cols, lines, markdown=True).splitlines()
    out = []
    for title, key, fmt in (
        ("tok/s", "tps", kfmt),
        ("MFU", "mfu_median", lambda x: ffmt(x, ".1%")),
        ("peak GiB", "peak", lambda x: ffmt(x, ".2f")),
    ):
        cols = [(title, "")] + [(m, ">") for m in methods]
        if key == "tps":
            cols += [("ours/hf", ".3f"), ("ours/lk", ".3f"), ("oc/hc", ".3f"), ("targets (dense rows)", "")]
            cols += [("ours_tp/liger", ".3f")] if "ours_tp" in methods else []
        lines = []
        for row in rows:
            line = [label_of(row)] + [value_cell(row["methods"].get(m, {}), key, fmt) for m in methods]
            if key == "tps":
                r = row["ratios"]
                line += [r["ours/hf"], r["ours/liger"], r["oc/hc"]]
                line.append(verdicts(row["targets"]) if row["targets"] else "(MoE: reported, no target)")
                line += [r.get("tp/liger")] if "ours_tp" in methods else []
            lines.append(line)
        out += harness.table(cols, lines).splitlines() + [""]
    return out


def loss_lines(rows: list[dict], methods: list[str]) -> list[str]:
    cols = [("row", ""), ("band", ".2e"), ("repeats", ".2e"), ("noise", ".2e")] + [(m, ">") for m in methods]
    lines = []
    for row in rows:
        c = row["loss_check"]
        line = [label_of(row), c["band"], c["band_repeats"], c["band_noise"]]
        for m in methods:
            dev = c["dev"].get(m)
            line.append(ffmt(dev, ".2e") + ("!" if c["within"].get(m) is False else " "))
        lines.append(line)
    title = (
        "loss check: max over steps of |loss - HF repeat 0's|; band = max(HF repeats' spread, hf_noise's "
        "distance); '!' marks a method outside the band"
    )
    out = harness.table(cols, lines, title).splitlines()
    return out + fp32_lines(rows, [m for m in methods if m != FP32_REF] + [NOISE])


def fp32_lines(rows: list[dict], methods: list[str]) -> list[str]:
    """Each method's largest distance from the fp32 curve (rows where hf_fp32 ran; none: no lines)."""
    rows = [r for r in rows if r["loss_check"].get("fp32_dev")]
    if not rows:
        return []
    title = f"distance from {FP32_REF} (max over steps of |loss - fp32 curve|; {NOISE}: its farthest draw)"
    cols = [("row", "")] + [(m, ".2e") for m in methods]
    lines = [[label_of(r)] + [r["loss_check"]["fp32_dev"].get(m) for m in methods] for r in rows]
    return harness.table(cols, lines, title).splitlines()


def print_report(rows: list[dict], runs: list[dict], meta: dict) -> None:
    methods = [m for m in meta["methods"] if m != NOISE]
    ok = [r for r in runs if r.get("ok") and r["method"] != PROBE]
    if ok:
        outside = [r["wall_s"] - sum(r["step_s"]) for r in ok]
        print(
            f"\nper process: wall {statistics.median([r['wall_s'] for r in ok]):.1f} s median, "
            f"{statistics.median(outside):.1f} s of it outside the steps; {len(runs)} processes, "
            f"{meta.get('wall_s', 0):.0f} s in all ({'spawned' if meta.get('spawn') else 'forked'})"
        )
    for r in runs:
        if not r.get("ok"):
            print(
                f"  ERROR {r['model']} {r['shape']} {r['method']} r{r['repeat']}: {r.get('error', '')[:140]}"
            )
    plans = {
        (r["model"], r["shape"]): r["flce_plan"] for r in ok if r.get("flce_plan") and r["method"] == "ours"
    }
    for (model, shape), plan in plans.items():
        print(f"  FLCE plan {model} {shape}: {plan}")
    print(f"\n{meta['title']}")
    rates = sorted({f"{r['mm_tflops']:.3g}" for r in runs if r.get("mm_tflops")})
    print(
        f"tok/s: median over processes of each one's median step after {meta['warmup']} of {meta['steps']}; "
        f"MFU: model FLOPs (6 x matmul params + attention) / step / the mm probe's rate "
        f"({', '.join(map(str, rates)) or '-'} TFLOP/s); peak: max allocated GiB"
    )
    for line in table_lines(rows, methods):
        print(line)
    for line in loss_lines(rows, methods):
        print(line)
    for row in rows:
        for name in methods:
            m = row["methods"].get(name, {})
            if m.get("compile") is not None and (e2e.is_compiled(name) or m["compile"] > 1.0):
                first = "" if m.get("first_step") is None else f", first step {m['first_step']:.1f} s"
                print(
                    f"  compile {label_of(row)} {name}: {m['compile']:.1f} s beyond the warm-up steps' median{first}"
                )
        for name, x in row.get("recipes", {}).items():
            print(f"  {label_of(row)} {name}: {'-' if x is None else f'{x:.3f}'}")
    if meta.get("markdown"):
        print()
        for line in table_lines(rows, methods, markdown=True):
            print(line)
    flat = [v for row in rows for v in row["targets"].values()]
    within = [v for row in rows for v in row["loss_check"]["within"].values()]
    print(
        f"targets: {sum(1 for v in flat if v)} met, {sum(1 for v in flat if v is False)} MISSED, "
        f"{sum(1 for v in flat if v is None)} not evaluable; loss within HF's noise: "
        f"{sum(1 for v in within if v)} yes, {sum(1 for v in within if v is False)} NO, "
        f"{sum(1 for v in within if v is None)} unchecked; json: {meta['json']}; png: {', '.join(meta['png'])}"
    )


def plot(rows: list[dict], methods: list[str], results: harness.Results) -> list[str]:
    methods = [m for m in methods if m != NOISE]
    labels = [label_of(r).replace(" ", "\n", 1) for r in rows]
    n, width = len(rows), 0.8 / max(len(methods), 1)

    def bars(plt):
        fig, axes = plt.subplots(3, 1, figsize=(max(10, 1.6 * n), 12))
        for ax, (key, title, scale) in zip(
            axes,
            (
                ("tps", "tokens/s (k)", 1e-3),
                ("mfu_median", "MFU (%)", 100.0),
                ("peak", "peak allocated GiB", 1.0),
            ),
            strict=True,
        ):
            for k, m in enumerate(methods):
                vals = [(row["methods"].get(m, {}).get(key) or 0.0) * scale for row in rows]
                drawn = ax.bar([i + k * width for i in range(n)], vals, width, label=m)
                if key == "tps":
                    ax.bar_label(drawn, fmt="%.1f", fontsize=6)
            ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(n)], labels, fontsize=7)
            ax.set_title(title)
            ax.legend(fontsize=7, ncol=len(methods))
        return fig

    def curves(plt):
        cols = 4
        grid = math.ceil(n / cols) * 2
        fig, axes = plt.subplots(grid, cols, figsize=(18, 3.0 * grid), squeeze=False)
        for i, row in enumerate(rows):
            top, bottom = axes[2 * (i // cols)][i % cols], axes[2 * (i // cols) + 1][i % cols]
            loss_panel(top, bottom, row, methods)
        for j in range(n, grid // 2 * cols):
            axes[2 * (j // cols)][j % cols].axis("off")
            axes[2 * (j // cols) + 1][j % cols].axis("off")
        return fig

    return [
        harness.plot(bars, results.path("png", "_tps")),
        harness.plot(curves, results.path("png", "_loss")),
    ]


def loss_panel(top, bottom, row: dict, methods: list[str]) -> None:
    """One row's loss curves (top) and their distance from HF repeat 0's with HF's noise band (bottom)."""
    ref = (row["methods"].get("hf", {}).get("curves") or [None])[0]
    for k, m in enumerate([*methods, NOISE]):
        for j, curve in enumerate(row["methods"].get(m, {}).get("curves", [])):
            style = dict(
                label=m if j == 0 else None,
                color=f"C{k}",
                linestyle="--" if m == NOISE else "-",
                marker=".",
            )
            top.plot(range(1, len(curve) + 1), curve, **style)
            if ref:
                bottom.plot(
                    range(1, len(curve) + 1), [a - b for a, b in zip(curve, ref, strict=False)], **style
                )
    band = row["loss_check"]["band"]
    if ref and band:
        bottom.axhspan(-band, band, color="grey", alpha=0.2, label="HF noise band")
    top.set_title(label_of(row), fontsize=8)
    bottom.set_title("loss - HF repeat 0", fontsize=7)
    for ax in (top, bottom):
        ax.tick_params(labelsize=6)
        ax.xaxis.get_major_locator().set_params(integer=True)
    top.legend(fontsize=6)


def title_of(runs: list[dict], args: argparse.Namespace) -> str:
    env = next((r["env"] for r in runs if r.get("env", {}).get("device")), None) or next(
        (r["env"] for r in runs if "env" in r), {}
    )
    attn = sorted({f"{r['model']}: {r['attn']}" for r in runs if r.get("attn") and r["attn"] != "sdpa"})
    of = lambda key: "/".join(sorted({str(r[key]) for r in runs if r.get(key) is not None})) or "-"  # noqa: E731
    smoke = any(r.get("smoke") for r in runs)
    return (
        f"training step (fwd, bwd, AdamW {of('optimizer')}), {'fp32 CPU smoke' if smoke else 'bf16'}, "
        f"SDPA{' (' + ', '.join(attn) + ')' if attn else ''}, compile: {of('compile')}; "
        f"{env.get('device', 'cpu')}, torch {env.get('torch')}, transformers {env.get('transformers')}"
        + (f", liger-kernel {env['liger_kernel']}" if env.get("liger_kernel") else "")
    )


def main(argv=None) -> int:
    args = parse(argv)
    if args.child is not None:
        child_main(json.loads(args.child), args.result)
        return 0
    # autotuned kernels (ours, the peer's MoE) tune once per shape and call, not once per process
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    tag = args.tag or ("merged" if args.merge else "")
    meta = {
        "methods": args.methods.split(","),
        "steps": args.steps,
        "warmup": args.warmup,
        "spawn": args.spawn,
        "args": vars(args),
        "markdown": args.markdown,
    }
    start = time.perf_counter()

    def save(runs: list[dict], rows: list[dict] | None = None, partial: bool = False) -> None:
        """The JSON so far (a run cut short keeps what ran); the CSV rows come with the last save."""
        results = e2e.results_of(args, runs, bench="step", tag=tag)
        meta["json"] = str(results.path("json"))
        payload = {"meta": {**meta, "partial": partial}, "rows": rows or [], "runs": runs}
        if partial:
            harness.write_json(results.path("json").name, {"env": results.env, **payload}, results.out)
            return
        for row in rows or []:
            for name, m in row["methods"].items():
                for key in ("tps", "peak", "mfu_median"):
                    results.add(f"{row['model']} {row['shape']}", name, key, m.get(key))
        results.write(payload)

    if args.merge:
        runs, seen = [], []
        for path in args.merge:
            data = json.loads(Path(path).read_text())
            runs += data["runs"]
            seen += [m for m in data["meta"]["methods"] if m not in seen]
        meta["methods"] = [m for m in METHODS if m in seen] + [m for m in seen if m not in METHODS]
        meta["merged"] = list(args.merge)
        for key in ("steps", "warmup"):
            meta[key] = "/".join(sorted({str(r[key]) for r in runs if key in r})) or "-"
    else:
        runs = drive(args, save, start)
    meta["wall_s"] = time.perf_counter() - start
    meta["title"] = title_of(runs, args)
    rows = summarise(runs)
    meta["png"] = plot(rows, meta["methods"], e2e.results_of(args, runs, bench="step", tag=tag))
    save(runs, rows)
    print_report(rows, runs, meta)
    return 0 if any(r.get("ok") and r["method"] != PROBE for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
