"""Finds the output projection's weight and bias, and applies a family's logit post-processing."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _plain_linear(module: Any) -> bool:
    return isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward


def active_head(lm_head: nn.Module) -> nn.Module:
    """The module that computes the logits: PEFT's `modules_to_save` copy of the head, or the original
    when no adapter is active."""
    copies = getattr(lm_head, "modules_to_save", None)
    if not (
        isinstance(copies, nn.ModuleDict) and isinstance(getattr(lm_head, "original_module", None), nn.Module)
    ):
        return lm_head
    active = list(getattr(lm_head, "active_adapters", None) or [])
    if getattr(lm_head, "disable_adapters", False) or not active or active[0] not in copies:
        return lm_head.original_module
    return copies[active[0]]


def _lora_parameters(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W + sum of scaling * B @ A, bias) of a PEFT LoRA linear head, when that is exactly what it computes.

    Not fusable (None): DoRA and other variants, LoRA bias, fan_in_fan_out, dropout active in training,
    adapters disabled while merged (PEFT unmerges in the forward).
    """
    base = getattr(module, "base_layer", None)
    lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
    if not (_plain_linear(base) and isinstance(lora_a, nn.ModuleDict) and isinstance(lora_b, nn.ModuleDict)):
        return None
    merged = bool(getattr(module, "merged", False))
    if getattr(module, "disable_adapters", False):
        return None if merged else (base.weight, base.bias)
    if merged or getattr(module, "fan_in_fan_out", False):
        return (base.weight, base.bias) if merged else None
    weight = base.weight
    for name in getattr(module, "active_adapters", []):
        if name not in lora_a:
            continue
        dropout = module.lora_dropout[name]
        dropping = isinstance(dropout, nn.Dropout) and dropout.p > 0 and dropout.training
        if name in getattr(module, "lora_variant", {}) or module.lora_bias.get(name) or dropping:
            return None
        a, b = lora_a[name].weight, lora_b[name].weight
        weight = weight + (b @ a.to(b.dtype)).to(weight.dtype) * module.scaling[name]
    return weight, base.bias


def head_parameters(lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) when the head is a linear projection FLCE can fuse, else None.

    Fusable: a plain nn.Linear, PEFT's `modules_to_save` wrapper around one (the active copy), and a PEFT
    LoRA linear (the adapter is folded into the weight, so the adapter gets its gradient through it).
    """
    head = active_head(lm_head)
    if _plain_linear(head):
        return head.weight, head.bias
    return _lora_parameters(head)


def _zero3_partitioned(module: nn.Module) -> bool:
    """DeepSpeed ZeRO-3 partitions the module's own parameters (they carry a `ds_id`; their data is gathered
    by DeepSpeed's hooks around the module's forward)."""
    return any(getattr(p, "ds_id", None) is not None for p in module.parameters(recurse=False))


def _sharded_head(lm_head: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(module to call, module whose forward to run) when FSDP or DeepSpeed ZeRO-3 shards the head.

    Outside its own forward such a head holds only a shard (FSDP2: DTensor parameters; FSDP1: a flat
    parameter; ZeRO-3: an empty placeholder): the full weight exists only while the head is being called.
    """
    if type(lm_head).__name__ == "FullyShardedDataParallel" and isinstance(
        getattr(lm_head, "module", None), nn.Module
    ):
        return lm_head, lm_head.module
    if _zero3_partitioned(lm_head):
        return lm_head, lm_head
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return (lm_head, lm_head) if isinstance(lm_head, FSDPModule) else None


def call_fused_head(lm_head: nn.Module, hidden: torch.Tensor, compute: Callable[..., Any]) -> Any | None:
    """`compute(hidden, weight, bias)` with the head's full weight, or None when the head cannot be fused.

    A head that FSDP shards on its own, or whose parameters ZeRO-3 partitions, is called, with `compute` as its
    forward for that one call: FSDP / DeepSpeed gather the weight before it and reduce the weight's gradient
    after, as for any other forward.
    """
    sharded = _sharded_head(lm_head)
    if sharded is None:
        params = head_parameters(lm_head)
        return None if params is None else compute(hidden, *params)
    outer, inner = sharded
    if not _plain_linear(inner):
        return None

    def forward(h: torch.Tensor) -> Any:
        return compute(h, inner.weight, inner.bias)

    inner.forward = forward
    try:
        return outer(hidden)
    finally:
        del inner.forward


def warn_unfusable(lm_head: nn.Module) -> None:
    warnings.warn(
        f"liger_registry: the lm_head is a {type(lm_head).__module__}.{type(lm_head).__qualname__}, which fused "
        "linear cross entropy cannot read as one linear projection (a PEFT LoRA head with dropout in training, a "
        "variant or a bias, or a custom head); "
        "the loss falls back to materialised logits (no fused linear cross entropy).",
        stacklevel=3,
    )


def logit_transform(
    config: Any, softcap_attr: str | None, scale_attr: str | None, multiplier_attr: str | None = None
) -> tuple[float | None, float]:
    """(softcap, scale) the family's original forward applies to its logits: divided by `scale_attr`,
    multiplied by `multiplier_attr`, then softcapped."""
    softcap = getattr(config, softcap_attr, None) if softcap_attr else None
    divisor = getattr(config, scale_attr, None) if scale_attr else None
    multiplier = getattr(config, multiplier_attr, None) if multiplier_attr else None
    scale = (1.0 / divisor if divisor else 1.0) * (1.0 if multiplier is None else float(multiplier))
    return softcap, scale


def postprocess_logits(logits: torch.Tensor, softcap: float | None, scale: float) -> torch.Tensor:
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits
