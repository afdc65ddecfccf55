"""Token scaling of FLCE (liger's ``use_token_scaling``): each token's loss times ``p_y``, the detached softmax
probability of its target, as per-row factors that scale a row's loss terms and its gradient."""

from __future__ import annotations

import torch

from .ce_torch import transform_logits
from .flce_target import corrected_lse

ROWS_PER_STEP = 256  # rows of fp32 logits upcast at a time: bounds the temporary beside the logits buffer


@torch.no_grad()
def chunk_target_probs(buf: torch.Tensor, target: torch.Tensor, opts, target_logit=None) -> torch.Tensor:
    """fp32 [rows]: ``p_y`` of each row of a raw logits chunk (0 on ignored rows), read before the row kernel
    overwrites the chunk; ``target_logit`` (16-bit logits, ``flce_target``) is the exact transformed z_y."""
    probs = torch.zeros(buf.shape[0], dtype=torch.float32, device=buf.device)
    for s in range(0, buf.shape[0], ROWS_PER_STEP):
        e = min(s + ROWS_PER_STEP, buf.shape[0])
        z = transform_logits(buf[s:e], opts.softcap, opts.logit_scale)
        valid = target[s:e] != opts.ignore_index
        safe = torch.where(valid, target[s:e], torch.zeros_like(target[s:e]))
        lse = torch.logsumexp(z, dim=-1)
        z_y = z.gather(1, safe[:, None]).squeeze(1)
        if target_logit is not None:
            lse = corrected_lse(lse, z_y, target_logit[s:e])
            z_y = target_logit[s:e]
        probs[s:e] = torch.where(valid, torch.exp(z_y - lse), torch.zeros_like(lse))
    return probs


def target_probs_from_lse(lse: torch.Tensor, z_y: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """fp32 [N]: ``p_y = exp(z_y - lse)`` on valid rows, 0 on ignored rows (the vocabulary strategy's rows)."""
    valid = target != ignore_index
    return torch.where(valid, torch.exp(z_y - lse), torch.zeros_like(lse))


def with_row_factor(row_grad: torch.Tensor | None, factor: torch.Tensor) -> torch.Tensor:
    """The per-row gradient factor of the row kernel, times ``factor``."""
    return factor if row_grad is None else factor * row_grad.to(torch.float32)
