"""The resolved configuration of a model or model type, with provenance, without patching anything.

Optionally also the backend each kernel would use (`device`/`dtype`) and the FLCE plan a step of `tokens`
tokens would get; those two need the kernels (and torch), the rest does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liger_registry.attr_path import text_config
from liger_registry.registry.configure import configure
from liger_registry.registry.loader import Registry
from liger_registry.registry.report import config_table, table
from liger_registry.registry.resolve import BUDGET, ResolvedConfig, not_applied_line


@dataclass
class Explanation:
    config: ResolvedConfig
    device: Any = None  # with dtype: show the backend of each kernel
    dtype: Any = None
    tokens: int | None = None  # show the FLCE plan for this many tokens per step
    hidden: int | None = None
    vocab: int | None = None
    model_config: Any = None  # the model's own config (explain on a model), for H and V
    gpu: str | None = (
        None  # plan for a GPU of this name (default: the current CUDA device, else a generic one)
    )

    def __str__(self) -> str:
        entry = self.config.entry
        forward = "none (no causal-LM head)" if entry.head is None else entry.forward
        lines = [f"family {entry.family} ({self.config.path.name}); forward {forward}"]
        if self.config.policies:
            files = self.config.policy_files
            named = [f"{p} ({files[p]})" if p in files else p for p in self.config.policies]
            lines.append(f"policies: {', '.join(named)}")
        if left_out := not_applied_line(self.config):
            lines.append(left_out)
        lines.append(config_table(self.config))
        reasons = [(k, s.reason) for k, s in entry.kernels if s is not None and s.reason]
        reasons += [("flce", entry.flce.reason)] if entry.flce.reason else []
        reasons += [("family", entry.reason)] if entry.reason else []
        lines += [f"reason ({k}): {r}" for k, r in reasons]
        lines += [f"{switch}: {note}" for switch, note in self.config.noops.items()]
        lines += [f"known broken: transformers {v}: {why}" for v, why in entry.known_broken.items()]
        if self.device is not None:
            lines.append(self.backends_text())
        if self.tokens is not None:
            lines.append(self.plan_text())
        return "\n".join(lines)

    def value(self, knob: str) -> Any:
        return self.config.values[knob]

    def source(self, knob: str):
        return self.config.source(knob)

    def backends(self) -> list:
        """`kernels.decide_backend` for each installed kernel on this explanation's device and dtype."""
        from liger_registry.registry.backends import decide_backends

        return decide_backends(self.config.entry, self.device, _dtype(self.dtype, "float32"))

    def backends_text(self) -> str:
        rows = [[c.kernel, c.op, c.backend, c.why()] for c in self.backends()]
        head = f"backends on {self.device} / {str(_dtype(self.dtype, 'float32')).removeprefix('torch.')}:"
        return head + "\n" + table(["kernel", "op", "backend", "why not triton"], rows)

    def plan(self):
        """`kernels.flce_plan` for `tokens` tokens with the resolved budget knobs (None when FLCE is off)."""
        from liger_registry import kernels

        entry = self.config.entry
        if entry.head is None or not entry.flce.enabled:
            return None
        hidden, vocab = self.shape()
        flce = entry.flce
        return kernels.flce_plan(
            self.tokens,
            hidden,
            vocab,
            chunk_mem_const=flce.chunk_mem_const,
            max_chunk_mib=flce.max_chunk_mib,
            strategy=flce.strategy,
            dtype=_dtype(self.dtype, "bfloat16"),
            **({"gpu": self.gpu} if self.gpu else {}),
        )

    def shape(self) -> tuple[int, int]:
        """(H, V): given, else the model's (text) config, else the model type's config class defaults."""
        from liger_registry.registry.targets import default_language_config

        entry = self.config.entry
        config = self.model_config
        if config is not None:
            config = text_config(config, entry.head.text_config_attr if entry.head else None)
        else:
            config = default_language_config(entry)
        hidden = config.hidden_size if self.hidden is None else self.hidden
        return hidden, config.vocab_size if self.vocab is None else self.vocab

    def plan_text(self) -> str:
        plan = self.plan()
        if plan is None:
            return f"FLCE plan for {self.tokens} tokens: none (fused linear cross entropy is off for this family)"
        plan = _named_device(plan)
        hidden, vocab = self.shape()
        dtype = str(_dtype(self.dtype, "bfloat16")).removeprefix("torch.")
        knobs = [*BUDGET, "flce.strategy"]
        lines = [
            f"FLCE plan for {self.tokens} tokens (H={hidden}, V={vocab}, {dtype}): {plan}",
            f"  strategy {plan.strategy}: {plan.why}",
            f"  budget {plan.budget_mib:.1f} MiB, logits buffer {plan.buffer_mib:.1f} MiB, "
            + _chunks_text(plan),
        ]
        lines += [f"  {knob} = {self.value(knob)!r}  (set by {self.source(knob)})" for knob in knobs]
        return "\n".join(lines)


DTYPES = ("float32", "float16", "bfloat16", "float64")  # what a backend or a plan is decided for


def _dtype(value: Any, fallback: str):
    import torch

    value = value or fallback
    if isinstance(value, str) and not isinstance(getattr(torch, value, None), torch.dtype):
        raise ValueError(f"dtype {value!r} is not a torch dtype; one of: {', '.join(DTYPES)}")
    return getattr(torch, value) if isinstance(value, str) else value


def parse_device(text: str):
    """`torch.device(text)`, its error a ValueError that says what a device is."""
    import torch

    try:
        return torch.device(text)
    except RuntimeError:
        raise ValueError(f"{text!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None


def gpu_name(name: str) -> str:
    """`name` when the FLCE cost model has peaks for it (matched as the planner matches a device name), else a
    ValueError naming the GPUs it knows: an unknown one would be costed for generic peaks, silently."""
    from liger_registry.kernels.flce.plan import known_peaks

    known_peaks(name)
    return name


def _check_sizes(**sizes: int | None) -> None:
    for name, value in sizes.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")


def explain(
    model_or_model_type: Any,
    policy: str | Path | list | None = None,
    *,
    registry: Registry | None = None,
    device: Any = None,
    dtype: Any = None,
    tokens: int | None = None,
    hidden: int | None = None,
    vocab: int | None = None,
    gpu: str | None = None,
    **overrides: Any,
) -> Explanation:
    """What apply() would install, each knob with the layer that set it; patches nothing, imports no applier.

    `device`/`dtype` (e.g. "cpu", "float32"; a model's own when a model is given) add the backend of each
    kernel with the reasons it is not Triton; `tokens` adds the FLCE plan for that many tokens per step
    (H and V from `hidden`/`vocab`, else the model's config or the model type's defaults), costed for the GPU named
    `gpu` (e.g. "NVIDIA H200"; matched against the cost model's table) or, by default, this machine's.
    """
    _check_sizes(tokens=tokens, hidden=hidden, vocab=vocab)
    if gpu is not None:
        gpu_name(gpu)
    if isinstance(dtype, str):
        _dtype(dtype, dtype)
    if isinstance(device, str):
        parse_device(device)
    config = configure(model_or_model_type, policy, registry, **overrides)
    model_config = None
    if not isinstance(model_or_model_type, str):
        from liger_registry.registry.configure import unwrap_model

        inner = unwrap_model(model_or_model_type)
        model_config = getattr(inner, "config", None)
        parameter = next(iter(inner.parameters()), None) if hasattr(inner, "parameters") else None
        if parameter is not None and device is None:
            device, dtype = parameter.device, dtype or parameter.dtype
    return Explanation(config, device, dtype, tokens, hidden, vocab, model_config, gpu)


def _named_device(plan):
    """The plan with its time labelled by the GPU it assumes: the cost table's generic row (no CUDA device and no
    gpu named) is spelled out with its peaks, and how to name a GPU instead."""
    import dataclasses

    import torch

    from liger_registry.kernels.flce.plan import DEFAULT_PEAKS, PEAKS

    if getattr(plan, "device", None) != DEFAULT_PEAKS.name:
        return plan
    why = (
        f"{torch.cuda.get_device_name()} is not in the cost table"
        if torch.cuda.is_available()
        else "no CUDA device here"
    )
    generic = (
        f"a generic GPU ({DEFAULT_PEAKS.flops / 1e12:.0f} TFLOP/s, {DEFAULT_PEAKS.copy_bw / 1e12:.1f} TB/s; "
        f"{why}; gpu=/--gpu names one: {', '.join(p.name for p in PEAKS)})"
    )
    return dataclasses.replace(plan, device=generic)


def _chunks_text(plan) -> str:
    if plan.scratch:
        return (
            f"{plan.pass1_chunks} + {plan.num_chunks} chunk(s) of {plan.chunk_tokens} tokens (pass 1 + pass 2), up "
            f"to {plan.widest} vocabulary columns in the weight gradient's not yet written memory, the rest in "
            f"buffer chunks of <= {plan.chunk_vocab} (a frozen lm_head: buffer chunks only)"
        )
    return f"{plan.num_chunks} chunk(s) of {plan.chunk_tokens} tokens x {plan.chunk_vocab} vocabulary"
