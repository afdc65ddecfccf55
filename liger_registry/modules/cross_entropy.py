"""Drop-in for transformers.loss.loss_utils.fixed_cross_entropy on the fused cross-entropy kernel."""

from __future__ import annotations

import torch

from liger_registry import kernels


def fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index: int = -100, **kwargs):
    """HF semantics: sum then divide by num_items_in_batch when it is given, else mean; the loss in the source's
    dtype, as ``F.cross_entropy`` returns it (fp32 from ``ForCausalLMLoss``, which upcasts the logits first)."""
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = kernels.cross_entropy(source, target, ignore_index=ignore_index, reduction=reduction)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss
