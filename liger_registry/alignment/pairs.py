"""The paired-batch layout of DPO, ORPO and SimPO: the chosen sequences first, then the rejected ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_paired(hidden: torch.Tensor) -> None:
    if hidden.dim() != 3 or hidden.shape[0] % 2:
        raise ValueError(
            "a paired loss takes hidden [2B, T, H]: B chosen sequences, then their B rejected ones; got "
            f"{tuple(hidden.shape)}"
        )


def split_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) halves along the batch dimension."""
    half = x.shape[0] // 2
    return x[:half], x[half:]


def smoothed_sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """``-(1 - e) log sigmoid(z) - e log sigmoid(-z)`` per pair: the sigmoid preference loss, conservative with
    label smoothing ``e`` (the preference label is wrong with probability e)."""
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def check_label_smoothing(label_smoothing: float) -> float:
    if not 0.0 <= float(label_smoothing) <= 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5], got {label_smoothing}")
    return float(label_smoothing)


def check_positive(name: str, value: float) -> float:
    if not float(value) > 0.0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return float(value)
