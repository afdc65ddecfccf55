"""The pieces of the RL policy losses, on per-token log-probs [B, T] (0 where masked): importance weights, the
per-token policy term of each loss type, the sampler correction, the sequence and entropy masks, the reduction.

Formulas as TRL's ``GRPOTrainer`` (1.16) computes them. A weight that is per sequence is [B, 1] and broadcasts
over the tokens.
"""

from __future__ import annotations

import math

import torch

from .grpo_options import CLIPPED, GrpoOptions

LOG_FLOOR = math.log(1e-8)  # VESPO's clamp of a log-weight, from below


def log_importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """``log pi - log pi_old`` per token [B, T], or its mean over each sequence's tokens [B, 1] (GSPO)."""
    if level == "token":
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)


def vllm_importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """The correction for sampling with another engine: ``pi_old / pi_sampler`` per token [B, T] (``token_*``)
    or per sequence [B, 1] (``sequence_*``: exp of the summed log-ratio), clamped into ``[clip_min, clip_max]``
    (``*_truncate``) or set to 0 outside it (``*_mask``). Tokens the sampler could not score (NaN) count as
    ratio 1."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


def off_policy_mask(
    adv: torch.Tensor, logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """[B, 1] (or like ``adv``): 1 to keep a sequence, 0 to drop it; dropped when its advantage is negative and
    its mean per-token ``log pi_sampler - log pi`` exceeds ``threshold`` (DeepSeek-V3.2's off-policy mask)."""
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return ((adv >= 0) | (mean_kl <= threshold)).to(torch.float32)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """[B, T] bool: the counted tokens whose entropy is at least the ``1 - top_quantile`` quantile of the
    counted tokens' entropies (linear interpolation)."""
    counted = entropy.detach()[mask].float()
    if counted.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(counted, 1.0 - top_quantile)
    return (entropy.detach() * mask >= threshold) & mask


@torch.no_grad()
def gamma_weights(
    adv: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    is_ratio: torch.Tensor | None,
    o: GrpoOptions,
) -> torch.Tensor:
    """VESPO's per-sequence weight ``phi(w) = exp(lambda + k log w - lambda w)`` (``phi(1) = 1``) of the
    sequence ratio ``w`` (the summed log-ratio, sampler correction included), ``k, lambda`` by the sign of the
    advantage; a constant (no gradient)."""
    seq = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
    if is_ratio is not None:
        seq = seq + torch.log(is_ratio).clamp(LOG_FLOOR, 20.0).sum(-1, keepdim=True)
    log_w = seq.clamp(LOG_FLOOR, 20.0)
    pos = adv >= 0
    k = torch.where(pos, o.vespo_k_pos, o.vespo_k_neg)
    lam = torch.where(pos, o.vespo_lambda_pos, o.vespo_lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_term(
    logps: torch.Tensor, coef: torch.Tensor, adv: torch.Tensor, o: GrpoOptions, phi: torch.Tensor | None
) -> torch.Tensor:
    """The per-token (or per-sequence) policy loss of ``o.loss_type`` from the importance weight ``coef``."""
    if o.loss_type == "cispo":  # the clipped weight is a constant: the gradient is that of A log pi
        return -torch.clamp(coef, max=o.high).detach() * adv * logps
    if o.loss_type == "sapo":  # a soft gate instead of the hard clip
        temp = torch.where(adv > 0, o.sapo_temperature_pos, o.sapo_temperature_neg)
        return -torch.sigmoid(temp * (coef - 1)) * 4 / temp * adv
    if o.loss_type == "vespo":
        return -phi * adv * logps
    clipped = torch.clamp(coef, 1 - o.epsilon_low, 1 + o.high)
    capped = coef if o.delta is None else torch.clamp(coef, max=float(o.delta))
    return -torch.min(capped * adv, clipped * adv)


def reduce(
    per_token: torch.Tensor, mask: torch.Tensor, o: GrpoOptions, num_items: int | torch.Tensor | None
) -> torch.Tensor:
    """The loss of one batch from the per-token losses, as ``o.loss_type`` normalises them."""
    m = mask.to(torch.float32)
    masked = per_token * m
    if o.loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / m.sum(-1).clamp(min=1)).mean()
    if o.loss_type == "bnpo":
        return masked.sum() / m.sum().clamp(min=1)
    if o.loss_type == "dr_grpo":
        length = m.shape[1] if o.max_completion_length is None else o.max_completion_length
        return masked.sum() / (m.shape[0] * length)
    if o.loss_type == "luspo":  # GSPO scaled by each sequence's length
        return masked.sum(-1).mean()
    items = m.sum() if num_items is None else torch.as_tensor(num_items, device=m.device)
    return masked.sum() / items.to(torch.float32).clamp(min=1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the counted tokens of [B, T], or over the sequences of [B, 1]."""
    x = x.detach().to(torch.float32)
    if x.shape[-1] == 1:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp(min=1)


def clip_metrics(coef: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, o: GrpoOptions) -> dict:
    """How often the ratio left the trust region, as TRL logs it for each loss type."""
    if o.loss_type in CLIPPED:
        capped = coef if o.delta is None else torch.clamp(coef, max=float(o.delta))
        low = (capped < 1 - o.epsilon_low) & (adv < 0)
        high = (capped > 1 + o.high) & (adv > 0)
        return {
            "clip_ratio/low_mean": masked_mean(low, mask),
            "clip_ratio/high_mean": masked_mean(high, mask),
            "clip_ratio/region_mean": masked_mean(low | high, mask),
        }
    if o.loss_type == "cispo":
        return {"cispo_clip_ratio": masked_mean((coef > o.high) & (adv > 0), mask)}
    return {}
