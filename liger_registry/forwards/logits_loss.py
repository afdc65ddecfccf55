"""The loss from materialised logits: under the FLCE options a family sets (z-loss, label smoothing, token
scaling), so a call that returns logits gives the loss the fused path gives; or transformers' loss by our
cross-entropy kernel (the family's cross_entropy switch)."""

from __future__ import annotations

import torch

from liger_registry import kernels
from liger_registry.kernels import FlceOptions
from liger_registry.kernels.ce.reference import ce_rows_differentiable


def changes_the_loss(options: FlceOptions | None) -> bool:
    """Whether the options make the loss differ from the model's own cross entropy."""
    return options is not None and bool(
        options.lse_square_scale or options.label_smoothing or options.use_token_scaling
    )


def logits_loss(
    logits: torch.Tensor, shift_labels: torch.Tensor, options: FlceOptions, num_items
) -> torch.Tensor:
    """FLCE's loss of post-processed logits [..., V] and next-token labels: mean over non-ignored tokens, or the
    sum divided by `num_items_in_batch` when given (as the fused path)."""
    flat = logits.reshape(-1, logits.shape[-1])
    target = shift_labels.reshape(-1).to(flat.device)
    ce, z = ce_rows_differentiable(
        flat,
        target,
        ignore_index=options.ignore_index,
        label_smoothing=options.label_smoothing,
        lse_square_scale=options.lse_square_scale,
    )
    rows = ce + z
    if options.use_token_scaling:
        valid = target != options.ignore_index
        safe = torch.where(valid, target, torch.zeros_like(target))
        p = torch.softmax(flat.detach().float(), -1).gather(1, safe[:, None]).squeeze(1)
        rows = rows * torch.where(valid, p, torch.zeros_like(p))
    if num_items is not None:
        return rows.sum() / (num_items.to(rows.device) if torch.is_tensor(num_items) else num_items)
    return rows.sum() / (target != options.ignore_index).sum().clamp(min=1)


def cross_entropy_loss(
    logits: torch.Tensor, shift_labels: torch.Tensor, ignore_index: int, num_items
) -> torch.Tensor:
    """transformers' causal-LM loss of materialised logits [..., V] and next-token labels, by the cross-entropy
    kernel: the logits upcast to fp32 as transformers does (so the loss is fp32 whatever dtype the kernel returns),
    the mean over non-ignored tokens, or the sum divided by `num_items_in_batch` when given."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    target = shift_labels.reshape(-1).to(flat.device)
    if num_items is None:
        return kernels.cross_entropy(flat, target, ignore_index=ignore_index)
    total = kernels.cross_entropy(flat, target, ignore_index=ignore_index, reduction="sum")
    return total / (num_items.to(total.device) if torch.is_tensor(num_items) else num_items)
