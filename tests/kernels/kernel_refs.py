"""Plain autograd references for the kernel tests (materialised logits, F.cross_entropy, ...)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def flce_reference(
    hidden,
    weight,
    target,
    bias=None,
    *,
    ignore_index=-100,
    label_smoothing=0.0,
    softcap=None,
    logit_scale=1.0,
    lse_square_scale=0.0,
    reduction="mean",
    class_weights=None,
):
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logits = logits.float() * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return ce_reference(
        logits,
        target,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale,
        reduction=reduction,
        class_weights=class_weights,
    )


def ce_reference(
    logits,
    target,
    *,
    ignore_index=-100,
    label_smoothing=0.0,
    lse_square_scale=0.0,
    reduction="mean",
    class_weights=None,
):
    logits = logits.float()
    valid = target != ignore_index
    if valid.any():
        ce = F.cross_entropy(
            logits,
            target,
            weight=None if class_weights is None else class_weights.float(),
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            reduction=reduction,
        )
    else:
        ce = logits.sum() * 0.0 if reduction != "none" else logits.sum(-1) * 0.0
    lse = torch.logsumexp(logits, -1)
    z = torch.where(valid, lse_square_scale * lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        zr = z
    elif reduction == "sum":
        zr = z.sum()
    else:
        zr = z.sum() / valid.sum().clamp(min=1)
    return ce + zr, zr
