"""ORPO (odds-ratio preference optimisation) through the fused head: the chosen sequences' NLL minus
``beta * mean(log sigmoid(log odds(chosen) - log odds(rejected)))``, where ``log odds(y) = a - log(1 - e^a)``
of the length-normalised log-prob ``a`` of y. No reference model. As TRL's ``ORPOTrainer`` computes it, with
the NLL over the chosen target tokens that are not ``ignore_index`` (mean over tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .head_options import HeadOptions
from .logprobs import token_log_probs
from .output import AlignmentOutput, detached
from .pairs import check_paired, check_positive, split_pairs

_LN_HALF = -0.6931471805599453


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for x < 0, without cancellation on either side of -ln 2; x is kept below 0 by one
    fp32 epsilon so that a sequence whose average log-prob rounds to 0 stays finite."""
    x = x.clamp(max=-torch.finfo(torch.float32).eps)
    return torch.where(x < _LN_HALF, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    **head_options,
) -> AlignmentOutput:
    """ORPO loss of ``hidden`` [2B, T, H] (B chosen sequences, then their B rejected ones) with next tokens
    ``target`` [2B, T] and head ``weight`` [V, H] (+ ``bias``). ``head_options``: see :class:`HeadOptions`.
    Metrics: nll_loss, log_odds_ratio, log_odds_chosen, rewards/chosen, rewards/rejected, rewards/accuracies."""
    options = HeadOptions(**head_options)
    beta = check_positive("beta", beta)
    check_paired(hidden)
    logps = token_log_probs(hidden, weight, target.to(hidden.device), bias, options)
    chosen_sum, _ = split_pairs(logps.sums())
    chosen_count, _ = split_pairs(logps.counts())
    nll = -chosen_sum.sum() / chosen_count.sum().clamp(min=1)
    chosen, rejected = split_pairs(logps.means())
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    ratio = F.logsigmoid(log_odds)
    loss = nll - beta * ratio.mean()
    return AlignmentOutput(
        loss,
        detached(
            nll_loss=nll,
            log_odds_ratio=ratio.mean(),
            log_odds_chosen=log_odds.mean(),
            **{
                "rewards/chosen": beta * chosen.mean(),
                "rewards/rejected": beta * rejected.mean(),
                "rewards/accuracies": (chosen > rejected).float().mean(),
            },
        ),
    )
