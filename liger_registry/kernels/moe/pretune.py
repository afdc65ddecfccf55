"""Pre-tuning: the tile searches of a model's MoE experts run ahead of training, so that its first step reads
the disk cache instead of searching (``liger-registry tune moe``).

* :data:`PRESETS`: the experts of the MoE families the benchmarks measure; :func:`shape_from_config`: the
  experts of a model's ``config.json``.
* :func:`pretune` runs one forward and backward of the experts (random weights and routing: the cache key
  holds sizes, never values) per token count on the GPU, which searches every bucket the training step will
  launch and writes it to the cache (``tune_cache``). Under the Triton interpreter (``TRITON_INTERPRET=1``, no
  GPU) it runs the same path on tiny sizes with the interpreter's single config: a check of the plumbing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from ..triton_utils import interpreting
from . import tune_cache, tuning


@dataclasses.dataclass(frozen=True)
class ExpertsShape:
    """One MoE layer's experts: count, per token, hidden and expert intermediate size, and the layout."""

    label: str
    experts: int
    top_k: int
    hidden: int
    inter: int
    act: str = "swiglu"
    bias: bool = False
    transposed: bool = False  # [E, in, out] weights (GPT-OSS)
    split: bool = False  # separate gate and up weights (DBRX's w1 / v1)

    def tiny(self) -> ExpertsShape:
        """The same layout at interpreter sizes."""
        return dataclasses.replace(self, experts=4, top_k=min(self.top_k, 2), hidden=32, inter=24)


PRESETS = {
    "qwen3_moe": ExpertsShape("Qwen3-30B-A3B", 128, 8, 2048, 768),
    "gpt_oss": ExpertsShape("GPT-OSS-20B", 32, 4, 2880, 2880, "clamped_swiglu", bias=True, transposed=True),
    "mixtral": ExpertsShape("Mixtral-8x7B", 8, 2, 4096, 14336),
    "dbrx": ExpertsShape("DBRX-132B", 16, 4, 6144, 10752, split=True),
}
GPT_OSS_LIMIT, GPT_OSS_ALPHA = 7.0, 1.702
BACKEND_ENV = "LIGER_REGISTRY_BACKEND"  # kernels/backend.py's switch


def _first(config: dict, *names: str):
    return next((config[n] for n in names if config.get(n) is not None), None)


def shape_from_config(path: str | Path) -> ExpertsShape:
    """The experts of a model's ``config.json`` (a file, or a directory holding one)."""
    path = Path(path)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON config ({exc})") from None
    config = config.get("text_config") or config
    ffn = config.get("ffn_config") or {}  # DBRX keeps its experts' sizes there
    model_type = config.get("model_type", "")
    sizes = dict(
        experts=_first(
            {**ffn, **config}, "num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"
        ),
        top_k=_first({**ffn, **config}, "num_experts_per_tok", "moe_top_k"),
        hidden=_first(config, "hidden_size", "d_model"),
        inter=_first({**ffn, **config}, "moe_intermediate_size", "ffn_hidden_size", "intermediate_size"),
    )
    if missing := [k for k, v in sizes.items() if not isinstance(v, int)]:
        raise ValueError(f"{path}: no MoE experts found (missing {', '.join(missing)})")
    if model_type == "gpt_oss":
        return ExpertsShape(model_type, **sizes, act="clamped_swiglu", bias=True, transposed=True)
    return ExpertsShape(model_type or path.parent.name, **sizes, split=model_type == "dbrx")


@contextlib.contextmanager
def _triton_backend():
    """The Triton kernels for CPU tensors too (the interpreter's run)."""
    old = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = "triton"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = old


def _weights(shape: ExpertsShape, device, dtype) -> dict:
    e, h, i = shape.experts, shape.hidden, shape.inter
    gu_rows = i if shape.split else 2 * i

    def param(*size):
        return (torch.randn(*size, device=device, dtype=dtype) * 0.02).requires_grad_()

    w = dict(
        gate_up_proj=param(e, h, gu_rows) if shape.transposed else param(e, gu_rows, h),
        down_proj=param(e, i, h) if shape.transposed else param(e, h, i),
    )
    if shape.split:  # DBRX: w1 and v1 [E, I, H]; w2 stored [E, I, H] and passed as its transposed view
        w["up_proj"] = param(e, i, h)
        w["down_proj"] = param(e, i, h).transpose(1, 2)
    if shape.bias:
        w.update(gate_up_bias=param(e, 2 * i), down_bias=param(e, h))
    return w


def run_step(shape: ExpertsShape, tokens: int, device, dtype) -> None:
    """One forward and backward of the experts at this size (what a training step launches)."""
    from . import moe_experts

    x = torch.randn(tokens, shape.hidden, device=device, dtype=dtype).requires_grad_()
    logits = torch.randn(tokens, shape.experts, device=device)
    top, idx = torch.topk(logits, shape.top_k, dim=-1)
    weights = torch.softmax(top, dim=-1).to(dtype).requires_grad_()
    w = _weights(shape, device, dtype)
    gate = dict(act=shape.act, transposed=shape.transposed)
    if shape.act == "clamped_swiglu":
        gate.update(limit=GPT_OSS_LIMIT, alpha=GPT_OSS_ALPHA)
    out = moe_experts(x, idx, weights, w.pop("gate_up_proj"), w.pop("down_proj"), **w, **gate)
    out.backward(torch.randn_like(out))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _snapshot() -> dict[str, tuple[int, int, int]]:
    return {name: (len(t.searches), len(t.cached), len(t.defaulted)) for name, t in tuning.TUNERS.items()}


def _outcomes(before: dict[str, tuple[int, int, int]]) -> list[dict]:
    """What the tuners did since ``before``: a row per bucket searched, read from the cache, or given the
    heuristic's first config (one candidate, or searches off)."""
    rows = []
    for name, t in tuning.TUNERS.items():
        n_search, n_cached, n_default = before.get(name, (0, 0, 0))
        for s in t.searches[n_search:]:
            rows.append(
                dict(kernel=name, bucket=s.bucket, config=str(s.config), source="searched", s=s.seconds)
            )
        for source, buckets in (("cache", t.cached[n_cached:]), ("heuristic", t.defaulted[n_default:])):
            rows += [
                dict(kernel=name, bucket=b, config=str(t.picks[b]), source=source, s=0.0) for b in buckets
            ]
    return rows


def device_or_refusal() -> torch.device:
    """The GPU the searches run on, or the CPU under the interpreter; a ValueError that says why otherwise."""
    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            "tuning times the kernels on the GPU that will train, and torch sees no CUDA device here; run it "
            "there (TRITON_INTERPRET=1 runs the same path on tiny sizes on the CPU, to check it)"
        )
    return torch.device("cuda", torch.cuda.current_device())


def pretune(shape: ExpertsShape, tokens: list[int], dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """Search (or read from the cache) every bucket of ``shape``'s experts at each token count; a row per
    bucket: tokens, kernel, bucket, config, ``searched`` / ``cache``, seconds. Under the interpreter: tiny sizes,
    fp32, nothing to search."""
    device = device_or_refusal()
    if device.type == "cpu":
        shape, dtype, tokens = shape.tiny(), torch.float32, [min(t, 16) for t in tokens]
    rows = []
    with _triton_backend():
        for t in tokens:
            before, start = _snapshot(), time.perf_counter()
            run_step(shape, t, device, dtype)
            rows += [dict(tokens=t, **row, step_s=time.perf_counter() - start) for row in _outcomes(before)]
    return rows


def describe_cache() -> str:
    if not tune_cache.enabled():
        return f"disk cache off ({tune_cache.SWITCH_ENV}=0): the searches above are kept by this process only"
    return f"cache: {tune_cache.cache_dir()}"
