"""The rule of cross entropy's opt-in in-place backward: which logits may be overwritten with their gradient.

Why it exists: the cross-entropy kernel computes the gradient in the same pass that reads the logits. Writing it
over the logits (as the reference library always does) saves one [N, V] buffer and its write bandwidth: 1 GiB and
~0.1 ms per call at 4096 x 128256 bf16 on an H200. It is opt-in (``inplace_backward=True``) because the caller's
logits hold the gradient afterwards.

The rule: the logits must be contiguous and must not be a partial view of a larger tensor (a slice, shifted
logits: the rest of that tensor would keep logits beside the gradient). A view of the whole of a contiguous tensor
(``logits.view(-1, V)`` as transformers' loss makes) is the same memory and is accepted. The shared version
counter is bumped, so any other autograd node that saved these logits (or the tensor they view) fails at its
backward with PyTorch's "modified by an inplace operation" error instead of computing a wrong gradient. Reading
the logits after the call (an accuracy metric, returning them) reads the gradient: that is the caller's part.
"""

from __future__ import annotations

import torch


def check_inplace_logits(logits: torch.Tensor) -> None:
    """Raise ValueError if ``inplace_backward=True`` may not overwrite these logits (see the module docstring)."""
    if not logits.is_contiguous():
        raise ValueError(
            "cross_entropy(inplace_backward=True) needs contiguous logits (the gradient is written over them); "
            f"got strides {logits.stride()} for shape {tuple(logits.shape)}: pass logits.contiguous() or "
            "inplace_backward=False"
        )
    base = logits._base
    if base is not None and (base.numel() != logits.numel() or base.data_ptr() != logits.data_ptr()):
        raise ValueError(
            "cross_entropy(inplace_backward=True) cannot overwrite a partial view of a larger tensor "
            f"(logits {tuple(logits.shape)} view a tensor of shape {tuple(base.shape)}: the rest of it would "
            "keep logits beside the gradient); pass the whole tensor, a copy, or inplace_backward=False"
        )


def mark_overwritten(logits: torch.Tensor) -> None:
    """Bump the logits' version counter (shared with the tensor they view) after the kernel wrote over them."""
    torch.autograd.graph.increment_version(logits)
