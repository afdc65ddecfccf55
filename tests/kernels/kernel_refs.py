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


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place between two fp16 or bf16 tensors (int32; +0 and -0 are
    the same point, and the two neighbours of zero are 2 apart)."""
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"ulp_distance takes two fp16 or two bf16 tensors, got {a.dtype} and {b.dtype}")

    def ordered(x):
        bits = x.view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


def bits_apart(ours: torch.Tensor, ref: torch.Tensor) -> tuple[int, float]:
    """(largest ulp distance, fraction of elements whose bits differ) between two fp16/bf16 tensors."""
    d = ulp_distance(ours, ref)
    return int(d.max()) if d.numel() else 0, (d > 0).float().mean().item() if d.numel() else 0.0
