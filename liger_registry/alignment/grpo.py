"""GRPO and the RL policy losses of TRL's ``GRPOTrainer`` (1.16) through the fused head: ``grpo``, ``bnpo``,
``dr_grpo``, ``dapo``, ``cispo``, ``sapo``, ``luspo``, ``vespo``, with token- or sequence-level (GSPO)
importance sampling, the sampler (vLLM) importance-sampling correction, the off-policy sequence mask, the
high-entropy token mask and the entropy bonus.

Per token, with the importance weight ``rho = exp(log pi - log pi_old)`` (per sequence: the exp of the mean
log-ratio) and advantage ``A``, the policy term of each loss type (:func:`grpo_terms.policy_term`) is multiplied
by the off-policy mask, the entropy mask and the sampler correction, then ``beta * KL`` is added (TRL's
estimator ``exp(ref - log pi) - (ref - log pi) - 1``, times ``rho`` with ``use_bias_correction_kl``), the
result reduced as the loss type says, and ``entropy_coef`` times the mean entropy subtracted. See
docs/alignment.md.
"""

from __future__ import annotations

import torch

from .entropy import token_log_probs_and_entropy
from .grpo_options import GRPO_OPTION_NAMES, LOSS_TYPES, GrpoOptions
from .grpo_terms import (
    clip_metrics,
    gamma_weights,
    high_entropy_mask,
    log_importance_weights,
    masked_mean,
    off_policy_mask,
    policy_term,
    reduce,
    vllm_importance_sampling_ratio,
)
from .head_options import HeadOptions
from .logprobs import token_log_probs
from .output import AlignmentOutput, detached
from .reference import reference_logps

__all__ = ["LOSS_TYPES", "GrpoOptions", "grpo_loss", "vllm_importance_sampling_ratio"]


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
    sampling_logps: torch.Tensor | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    **options,
) -> AlignmentOutput:
    """RL policy loss of ``hidden`` [B, T, H] (prompt + completion; only the completion's tokens have a target
    other than ``ignore_index``) with next tokens ``target`` [B, T], head ``weight`` [V, H] (+ ``bias``) and
    ``advantages`` [B] or [B, T].

    ``old_logps`` [B, T]: the policy's per-token log-probs when the batch was generated (None: this policy's,
    detached: the ratio is 1 and only its gradient counts). With ``beta > 0`` the reference per-token
    log-probs: ``ref_logps`` [B, T] or a frozen reference head (``ref_hidden``, ``ref_weight``, ``ref_bias``).
    ``sampling_logps`` [B, T]: the sampler's (vLLM's) log-probs of the tokens; with them the loss is corrected
    by :func:`vllm_importance_sampling_ratio` (``vllm_importance_sampling_correction``, ``_mode``, ``_clip_min``,
    ``_clip_max``), and the off-policy mask measures against them. ``importance_sampling_ratio`` [B, T] or
    [B, 1]: that correction already computed (TRL's batch carries it), instead of ``sampling_logps``.
    ``num_items_in_batch``: ``dapo``/``cispo``/``vespo``'s normaliser, the counted tokens of the whole
    generation batch (this batch's when not given).

    ``options``: the fields of :class:`GrpoOptions` (loss type, importance-sampling level, clipping, KL, ...;
    TRL's names and defaults) and of :class:`HeadOptions` (``temperature``, softcap, chunk budget, ...).
    Metrics (detached, TRL's names): ``kl`` (beta > 0), ``entropy`` (with an entropy mask or bonus),
    ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean`` (clipped types),
    ``cispo_clip_ratio``, ``vespo/phi_seq_mean``, ``policy_loss`` (with an entropy bonus),
    ``sampling/importance_sampling_ratio/{min,mean,max}`` (with the sampler correction).
    """
    o, head = _split(options)
    target = target.to(hidden.device)
    adv = _advantages(advantages, target)
    if o.needs_entropy:
        logps, entropy = token_log_probs_and_entropy(hidden, weight, target, bias, head)
    else:
        logps, entropy = token_log_probs(hidden, weight, target, bias, head), None
    lp, mask = logps.values, logps.mask
    old = _per_token("old_logps", old_logps, lp, lp.detach())
    is_ratio, metrics = _sampler_correction(o, old, mask, sampling_logps, importance_sampling_ratio)
    log_ratio = torch.where(mask, lp - old, 0.0)
    coef = torch.exp(log_importance_weights(log_ratio, mask, o.importance_sampling_level))
    phi = gamma_weights(adv, log_ratio, mask, is_ratio, o) if o.loss_type == "vespo" else None
    per_token, keep = _masked(
        policy_term(lp, coef, adv, o, phi), o, adv, lp, mask, old, sampling_logps, entropy
    )
    if is_ratio is not None and o.loss_type != "vespo":  # VESPO folds the correction into its weights
        per_token = per_token * is_ratio
    if o.beta:
        kl = _kl(o, lp, mask, coef, target, head, ref_logps, ref_hidden, ref_weight, ref_bias)
        per_token = per_token + o.beta * kl
        metrics["kl"] = masked_mean(kl, mask)
    loss = reduce(per_token, mask, o, num_items_in_batch)
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy, mask)
    if o.entropy_coef != 0.0:  # the mean entropy of the tokens the policy term counts
        metrics["policy_loss"] = loss
        counted = mask if keep is None else keep
        loss = loss - o.entropy_coef * (entropy * counted).sum() / counted.sum().clamp(min=1)
    metrics.update(clip_metrics(coef, adv, mask, o))
    if phi is not None:
        metrics["vespo/phi_seq_mean"] = masked_mean(phi, mask)
    return AlignmentOutput(loss, detached(**metrics))


def _masked(per_token, o: GrpoOptions, adv, lp, mask, old, sampling_logps, entropy):
    """The policy term without the sequences the off-policy mask drops and the tokens the entropy mask drops;
    and the entropy mask (None without one)."""
    if o.off_policy_mask_threshold is not None:
        sampled = old if sampling_logps is None else _per_token("sampling_logps", sampling_logps, lp, None)
        per_token = per_token * off_policy_mask(adv, lp, sampled, mask, float(o.off_policy_mask_threshold))
    if o.top_entropy_quantile >= 1.0:
        return per_token, None
    keep = high_entropy_mask(entropy, mask, o.top_entropy_quantile)
    return per_token * keep, keep


def _split(options: dict) -> tuple[GrpoOptions, HeadOptions]:
    ours = {k: v for k, v in options.items() if k in GRPO_OPTION_NAMES}
    return GrpoOptions(**ours), HeadOptions(**{k: v for k, v in options.items() if k not in ours})


def _per_token(name: str, given: torch.Tensor | None, lp: torch.Tensor, default):
    if given is None:
        return default
    if tuple(given.shape) != tuple(lp.shape):
        raise ValueError(f"{name} must be [B, T] = {list(lp.shape)}; got {list(given.shape)}")
    return given.detach().to(lp.device, torch.float32)


def _advantages(advantages: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if advantages.shape not in (target.shape[:1], target.shape):
        raise ValueError(
            f"advantages must be [B] or [B, T] = {list(target.shape)}; got {list(advantages.shape)}"
        )
    adv = advantages.detach().to(target.device, torch.float32)
    return adv[:, None] if adv.dim() == 1 else adv


def _sampler_correction(o: GrpoOptions, old, mask, sampling_logps, given) -> tuple[torch.Tensor | None, dict]:
    """The sampler importance ratio ([B, T] or [B, 1]) or None, and its metrics."""
    if given is not None and sampling_logps is not None:
        raise ValueError("pass sampling_logps or importance_sampling_ratio, not both")
    if given is not None:
        if given.dim() != 2 or given.shape[0] != old.shape[0] or given.shape[1] not in (1, old.shape[1]):
            raise ValueError(
                f"importance_sampling_ratio must be [B, T] or [B, 1]; got {list(given.shape)} for {list(old.shape)}"
            )
        ratio = given.detach().to(old.device, torch.float32)
    elif sampling_logps is None or not o.vllm_importance_sampling_correction:
        return None, {}
    else:
        sampled = _per_token("sampling_logps", sampling_logps, old, None)
        ratio = vllm_importance_sampling_ratio(
            old, sampled, mask, o.vllm_importance_sampling_mode, o.clip_min, o.clip_max
        )
    if o.loss_type == "vespo" and ratio.shape[1] == 1:
        raise ValueError("vespo needs a per-token sampler correction: vllm_importance_sampling_mode token_*")
    flat = ratio.flatten() if ratio.shape[1] == 1 else ratio[mask]
    stats = {} if flat.numel() == 0 else {"min": flat.min(), "mean": flat.mean(), "max": flat.max()}
    return ratio, {f"sampling/importance_sampling_ratio/{k}": v for k, v in stats.items()}


def _kl(o, lp, mask, coef, target, head, ref_logps, ref_hidden, ref_weight, ref_bias) -> torch.Tensor:
    ref = reference_logps(ref_logps, ref_hidden, ref_weight, ref_bias, target, head, per_token=True)
    if ref is None:
        raise ValueError(
            "beta > 0 needs the reference: ref_logps or a reference head (ref_hidden, ref_weight)"
        )
    d = torch.where(mask, ref.to(lp.device) - lp, 0.0)
    kl = torch.exp(d) - d - 1
    return kl * coef if o.use_bias_correction_kl else kl
