"""Exact target logit of each row for FLCE: ``z_y = <x_n, W[y_n]> (+ b[y_n])`` accumulated in fp32, then
``logit_scale`` and ``softcap``, and the correction of a row's log-sum-exp for it.

16-bit logits round ``z_y`` by up to ~0.03 at ``z_y ~ 10`` (bf16), which on confident rows puts the loss ~1e-4
relative off float64. Both strategies keep their 16-bit logits buffer and use this fp32 ``z_y`` in the loss,
swapping the target's term of the row's sum-exp: ``d' = d - exp(z_y16 - m) + exp(z_y - m)``.
"""

from __future__ import annotations

import torch

from .ce_torch import corrected_lse as corrected_lse
from .ce_torch import transform_logits
from .triton_flce_target import target_logits_triton

ROWS_PER_STEP = 1024  # the PyTorch path upcasts this many [H] row pairs at a time (bounded fp32 temporaries)


def needs_exact_target(hidden: torch.Tensor) -> bool:
    """Only 16-bit logits round the target logit enough to matter."""
    return hidden.element_size() < 4


@torch.no_grad()
def target_logits_torch(hidden, weight, target, bias, *, ignore_index, softcap, logit_scale) -> torch.Tensor:
    """fp32 [N]: the transformed logit of each row's target (0 before the transform on ignored rows)."""
    safe = torch.where(target != ignore_index, target, torch.zeros_like(target))
    raw = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[0], ROWS_PER_STEP):
        idx = safe[s : s + ROWS_PER_STEP]
        raw[s : s + ROWS_PER_STEP] = (hidden[s : s + ROWS_PER_STEP].float() * weight[idx].float()).sum(-1)
    if bias is not None:
        raw += bias.float()[safe]
    return transform_logits(raw, softcap, logit_scale)


def target_logits(hidden, weight, target, bias, opts, backend: str) -> torch.Tensor:
    """:func:`target_logits_torch` or its Triton kernel, by the call's decided backend."""
    fn = target_logits_triton if backend == "triton" else target_logits_torch
    return fn(
        hidden,
        weight,
        target,
        bias,
        ignore_index=opts.ignore_index,
        softcap=opts.softcap,
        logit_scale=opts.logit_scale,
    )
