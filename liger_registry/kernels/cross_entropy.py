"""Cross entropy over rows of logits [N, V] (the PyTorch path; the Triton path plugs in via the op)."""

from __future__ import annotations

import torch

from . import ce_torch
from .labels import check_labels


def reduce_ce(ce: torch.Tensor, zl: torch.Tensor, target, ignore_index, class_weights, reduction):
    """Combine per-row ce and z-loss as ``fused_linear_cross_entropy`` does; returns (loss, z_loss)."""
    if reduction == "none":
        return ce + zl, zl
    if reduction == "sum":
        return ce.sum() + zl.sum(), zl.sum()
    _, n_valid, denom = ce_torch.denominators(target, ignore_index, class_weights)
    z = zl.sum() / n_valid.clamp(min=1.0)
    c = torch.where(denom > 0, ce.sum() / denom.clamp(min=1e-30), torch.zeros_like(denom))
    return c + z, z


def cross_entropy_torch(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    lse_square_scale: float = 0.0,
    class_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    if not torch.compiler.is_compiling():  # traced: no graph break; gather checks the bounds (labels.py)
        check_labels(target, ignore_index, logits.shape[1])
    ce, zl = ce_torch.ce_rows_differentiable(
        logits,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        softcap=softcap,
        lse_square_scale=lse_square_scale,
        class_weights=class_weights,
    )
    return reduce_ce(ce, zl, target, ignore_index, class_weights, reduction)[0]
