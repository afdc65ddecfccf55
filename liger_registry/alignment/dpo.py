"""DPO (direct preference optimisation) through the fused head: per-sequence log-probs chunk by chunk, then
``-(1 - e) log sigmoid(beta * d) - e log sigmoid(-beta * d)`` with
``d = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))``, averaged over pairs.

With ``label_smoothing = 0`` this is TRL's ``DPOTrainer`` ``loss_type="sigmoid"``; with e > 0 the conservative
form (cDPO) TRL applies in its ``aot`` losses and liger's DPO loss. Sequence log-probs are sums over the
target tokens that are not ``ignore_index``.
"""

from __future__ import annotations

import torch

from .head_options import HeadOptions
from .logprobs import token_log_probs
from .output import AlignmentOutput, detached
from .pairs import check_label_smoothing, check_paired, check_positive, smoothed_sigmoid_loss, split_pairs
from .reference import reference_logps


def dpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    ref_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    reference_free: bool = False,
    **head_options,
) -> AlignmentOutput:
    """DPO loss of ``hidden`` [2B, T, H] (B chosen sequences, then their B rejected ones) whose next tokens are
    ``target`` [2B, T] (see :func:`next_token_target`), with the policy head ``weight`` [V, H] (+ ``bias``).

    The reference: ``ref_logps`` [2B] (sequence log-probs, same layout), or a frozen reference head
    (``ref_hidden`` [2B, T, H'], ``ref_weight``, ``ref_bias``), or neither with ``reference_free=True``
    (the reference log-probs are 0). ``head_options``: see :class:`HeadOptions`.
    Metrics: rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen, logps/rejected.
    """
    options = HeadOptions(**head_options)
    beta = check_positive("beta", beta)
    label_smoothing = check_label_smoothing(label_smoothing)
    check_paired(hidden)
    target = target.to(hidden.device)
    logps = token_log_probs(hidden, weight, target, bias, options).sums()
    ref = reference_logps(ref_logps, ref_hidden, ref_weight, ref_bias, target, options, per_token=False)
    if ref is None and not reference_free:
        raise ValueError(
            "DPO needs a reference: ref_logps, a reference head (ref_hidden, ref_weight) or reference_free=True"
        )
    logratios = logps if ref is None else logps - ref.to(logps.device)
    chosen_logratios, rejected_logratios = split_pairs(logratios)
    losses = smoothed_sigmoid_loss(beta * (chosen_logratios - rejected_logratios), label_smoothing)
    chosen_rewards, rejected_rewards = beta * chosen_logratios, beta * rejected_logratios
    chosen_logps, rejected_logps = split_pairs(logps)
    return AlignmentOutput(
        losses.mean(),
        detached(
            **{
                "rewards/chosen": chosen_rewards.mean(),
                "rewards/rejected": rejected_rewards.mean(),
                "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
                "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
                "logps/chosen": chosen_logps.mean(),
                "logps/rejected": rejected_logps.mean(),
            }
        ),
    )
