"""Cross entropy over rows of logits [N, V] (the PyTorch path; the Triton path plugs in via the op)."""

from __future__ import annotations

import torch

from liger_registry.constants import IGNORE_INDEX

from . import ce_torch
from .ce_output import predicted_tokens
from .labels import check_labels


def reduce_ce(ce: torch.Tensor, zl: torch.Tensor, reduction, ce_scale, z_scale):
    """Combine per-row ce and z-loss as ``fused_linear_cross_entropy`` does, with the scales of
    :func:`ce_torch.loss_scales`; returns fp32 (loss, z_loss)."""
    if reduction == "none":
        return ce + zl, zl
    if reduction == "sum":
        return ce.sum() + zl.sum(), zl.sum()
    z = zl.sum() * z_scale
    return ce.sum() * ce_scale + z, z


def cross_entropy_torch(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    lse_square_scale: float = 0.0,
    class_weights: torch.Tensor | None = None,
    argmax_mode: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 ``(loss, z_loss, predicted)``: ``predicted`` is the row argmax (-1 on ignored rows) when
    ``argmax_mode`` is set, else empty."""
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
    scales = ce_torch.loss_scales(reduction, target, ignore_index, class_weights)
    loss, z = reduce_ce(ce, zl, reduction, *scales)
    if not argmax_mode:
        return loss, z, target.new_empty(0)
    z_rows = ce_torch.transform_logits(logits.detach(), softcap, 1.0)
    return loss, z, predicted_tokens(z_rows.argmax(-1), target, ignore_index)
