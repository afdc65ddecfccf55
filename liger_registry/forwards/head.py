"""Finds the output projection's weight and bias, and applies a family's logit post-processing."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn


def head_parameters(lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) when the head is a plain linear projection FLCE can fuse, else None."""
    if isinstance(lm_head, nn.Linear) and type(lm_head).forward is nn.Linear.forward:
        return lm_head.weight, lm_head.bias
    return None


def warn_unfusable(lm_head: nn.Module) -> None:
    warnings.warn(
        f"liger_registry: the lm_head is a {type(lm_head).__name__}, not a plain linear layer; "
        "the loss falls back to materialised logits (no fused linear cross entropy).",
        stacklevel=3,
    )


def text_config(config: Any, attr: str | None) -> Any:
    return getattr(config, attr) if attr else config


def logit_transform(config: Any, softcap_attr: str | None, scale_attr: str | None) -> tuple[float | None, float]:
    """(softcap, scale) the family's original forward applies to its logits."""
    softcap = getattr(config, softcap_attr, None) if softcap_attr else None
    divisor = getattr(config, scale_attr, None) if scale_attr else None
    return softcap, (1.0 / divisor if divisor else 1.0)


def postprocess_logits(logits: torch.Tensor, softcap: float | None, scale: float) -> torch.Tensor:
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits
