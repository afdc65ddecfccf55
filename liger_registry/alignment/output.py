"""AlignmentOutput: what every alignment loss returns (the loss and its detached metrics)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class AlignmentOutput(NamedTuple):
    """``loss``: the scalar to backpropagate. ``metrics``: detached tensors for logging (rewards, margins,
    log-probs, ...), named as TRL's trainers name them where they have one."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]


def detached(**metrics: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: value.detach() for name, value in metrics.items()}
