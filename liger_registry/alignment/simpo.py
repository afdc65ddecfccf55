"""SimPO (simple preference optimisation) through the fused head: a reference-free sigmoid loss on the
difference of length-normalised log-probs with a target margin ``gamma``:
``-(1 - e) log sigmoid(beta * (a_c - a_r) - gamma) - e log sigmoid(-(beta * (a_c - a_r) - gamma))``,
averaged over pairs, plus ``nll_weight`` times the chosen sequences' NLL. As TRL's ``CPOTrainer`` with
``loss_type="simpo"`` computes it (its ``cpo_alpha`` is ``nll_weight``; SimPO proper has 0).
"""

from __future__ import annotations

import torch

from .head_options import HeadOptions
from .logprobs import token_log_probs
from .output import AlignmentOutput, detached
from .pairs import check_label_smoothing, check_paired, check_positive, smoothed_sigmoid_loss, split_pairs


def simpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
    nll_weight: float = 0.0,
    **head_options,
) -> AlignmentOutput:
    """SimPO loss of ``hidden`` [2B, T, H] (B chosen sequences, then their B rejected ones) with next tokens
    ``target`` [2B, T] and head ``weight`` [V, H] (+ ``bias``). ``head_options``: see :class:`HeadOptions`.
    Metrics: rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, nll_loss."""
    options = HeadOptions(**head_options)
    beta = check_positive("beta", beta)
    label_smoothing = check_label_smoothing(label_smoothing)
    check_paired(hidden)
    logps = token_log_probs(hidden, weight, target.to(hidden.device), bias, options)
    chosen, rejected = split_pairs(logps.means())
    losses = smoothed_sigmoid_loss(beta * (chosen - rejected) - float(gamma), label_smoothing)
    chosen_sum, _ = split_pairs(logps.sums())
    chosen_count, _ = split_pairs(logps.counts())
    nll = -chosen_sum.sum() / chosen_count.sum().clamp(min=1)
    loss = losses.mean() + float(nll_weight) * nll if nll_weight else losses.mean()
    return AlignmentOutput(
        loss,
        detached(
            nll_loss=nll,
            **{
                "rewards/chosen": beta * chosen.mean(),
                "rewards/rejected": beta * rejected.mean(),
                "rewards/margins": beta * (chosen - rejected).mean(),
                "rewards/accuracies": (chosen > rejected).float().mean(),
            },
        ),
    )
