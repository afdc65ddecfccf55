"""GRPO (group relative policy optimisation) through the fused head: per-token clipped policy ratio with
advantages, plus an optional KL to a reference, as TRL's ``GRPOTrainer`` computes it (token-level importance
sampling).

Per token, with ``rho = exp(log pi - log pi_old)`` and advantage ``A``:
``-min(rho' A, clip(rho, 1 - eps_low, 1 + eps_high) A) + beta * (exp(ref - log pi) - (ref - log pi) - 1)``,
where ``rho'`` is ``min(rho, delta)`` when ``delta`` is set (two-sided clipping). The per-token losses are
reduced as ``loss_type`` says: ``grpo`` (mean over each sequence's tokens, then over sequences), ``bnpo``
(mean over all tokens), ``dr_grpo`` (sum / (B * max_completion_length)), ``dapo`` (sum / num_items_in_batch,
the number of tokens of the whole generation batch; this batch's when not given).
"""

from __future__ import annotations

import torch

from .head_options import HeadOptions
from .logprobs import token_log_probs
from .output import AlignmentOutput, detached
from .reference import reference_logps

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_len, num_items) -> torch.Tensor:
    masked = per_token * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        return masked.sum() / (mask.shape[0] * (mask.shape[1] if max_len is None else max_len))
    items = mask.sum() if num_items is None else torch.as_tensor(num_items, device=mask.device)
    return masked.sum() / items.to(torch.float32).clamp(min=1)


def _check(loss_type, epsilon_low, epsilon_high, beta, advantages, target) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
    if not (0.0 <= epsilon_low < 1.0 and epsilon_high >= 0.0):
        raise ValueError(
            f"need 0 <= epsilon_low < 1 and epsilon_high >= 0; got {epsilon_low}, {epsilon_high}"
        )
    if beta < 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if advantages.shape not in (target.shape[:1], target.shape):
        raise ValueError(
            f"advantages must be [B] or [B, T] = {list(target.shape)}; got {list(advantages.shape)}"
        )


def grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    advantages: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    **head_options,
) -> AlignmentOutput:
    """GRPO loss of ``hidden`` [B, T, H] (prompt + completion; only the completion's tokens have a target
    other than ``ignore_index``) with next tokens ``target`` [B, T], head ``weight`` [V, H] (+ ``bias``) and
    ``advantages`` [B] or [B, T].

    ``old_logps`` [B, T]: the sampling policy's per-token log-probs (None: this policy's, detached, so the
    ratio is 1 and only its gradient counts). With ``beta > 0`` the reference per-token log-probs:
    ``ref_logps`` [B, T] or a frozen reference head (``ref_hidden``, ``ref_weight``, ``ref_bias``).
    ``temperature`` and the other ``head_options``: see :class:`HeadOptions`. Defaults as TRL's GRPOConfig.
    Metrics: kl (mean per-token KL, when beta > 0), clip_ratio/low_mean, clip_ratio/high_mean,
    clip_ratio/region_mean.
    """
    options = HeadOptions(**head_options)
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    _check(loss_type, float(epsilon_low), float(epsilon_high), float(beta), advantages, target)
    target = target.to(hidden.device)
    logps = token_log_probs(hidden, weight, target, bias, options)
    lp, mask = logps.values, logps.mask
    old = lp.detach() if old_logps is None else old_logps.detach().to(lp.device, torch.float32)
    if old.shape != lp.shape:
        raise ValueError(f"old_logps must be [B, T] = {list(lp.shape)}; got {list(old.shape)}")
    adv = advantages.to(lp.device, torch.float32)
    adv = adv[:, None] if adv.dim() == 1 else adv
    ratio = torch.exp(torch.where(mask, lp - old, 0.0))
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    capped = ratio if delta is None else torch.clamp(ratio, max=float(delta))
    per_token = -torch.min(capped * adv, clipped * adv)
    metrics = {}
    if beta:
        ref = reference_logps(ref_logps, ref_hidden, ref_weight, ref_bias, target, options, per_token=True)
        if ref is None:
            raise ValueError(
                "beta > 0 needs the reference: ref_logps or a reference head (ref_hidden, ref_weight)"
            )
        d = torch.where(mask, ref.to(lp.device) - lp, 0.0)
        kl = torch.exp(d) - d - 1
        per_token = per_token + float(beta) * kl
        metrics["kl"] = (kl * mask).sum() / mask.sum().clamp(min=1)
    loss = _reduce(per_token, mask, loss_type, max_completion_length, num_items_in_batch)
    n = mask.sum().clamp(min=1)
    low = (ratio < 1 - epsilon_low) & (adv < 0) & mask
    high = (ratio > 1 + epsilon_high) & (adv > 0) & mask
    metrics["clip_ratio/low_mean"] = low.sum() / n
    metrics["clip_ratio/high_mean"] = high.sum() / n
    metrics["clip_ratio/region_mean"] = (low | high).sum() / n
    return AlignmentOutput(loss, detached(**metrics))
