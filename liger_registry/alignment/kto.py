"""KTO (Kahneman-Tversky optimisation) through the fused head: unpaired sequences, each labelled desirable or
not. With ``r = log pi(y) - log ref(y)`` (sequence log-prob sums) and the KL reference point ``z``:
desirable ``w_d * (1 - sigmoid(beta * (r - z)))``, undesirable ``w_u * (1 - sigmoid(beta * (z - r)))``,
averaged over the batch. As TRL's ``KTOTrainer`` with ``loss_type="kto"`` computes it.
"""

from __future__ import annotations

import torch

from .head_options import HeadOptions
from .logprobs import token_log_probs
from .output import AlignmentOutput, detached
from .pairs import check_positive
from .reference import reference_logps


def kto_reference_kl(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """The KL reference point ``z`` as TRL estimates it: the mean log-ratio of mismatched (prompt, completion)
    pairs under the policy and the reference, clamped at 0 and detached (no gradient flows through z).

    Get ``kl_logps`` / ``ref_kl_logps`` [B] from :func:`token_log_probs` ``(...).sums()`` of the two heads on
    the mismatched batch (under ``torch.no_grad()``)."""
    return (kl_logps.detach().float() - ref_kl_logps.detach().float()).mean().clamp(min=0)


def kto_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    desirable: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    kl: float | torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    ref_hidden: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    **head_options,
) -> AlignmentOutput:
    """KTO loss of ``hidden`` [B, T, H] with next tokens ``target`` [B, T], head ``weight`` [V, H] (+ ``bias``)
    and ``desirable`` [B] (bool: the completion is a good one).

    The reference: ``ref_logps`` [B] or a frozen reference head (``ref_hidden``, ``ref_weight``, ``ref_bias``);
    one is required. ``kl``: the reference point z (see :func:`kto_reference_kl`; None means 0, as without KL
    completions). ``head_options``: see :class:`HeadOptions`.
    Metrics: kl, rewards/chosen, rewards/rejected (means over the desirable / undesirable sequences, 0 if none).
    """
    options = HeadOptions(**head_options)
    beta = check_positive("beta", beta)
    if hidden.dim() != 3 or desirable.shape != (hidden.shape[0],) or desirable.dtype != torch.bool:
        raise ValueError(
            f"desirable must be a bool tensor [B={hidden.shape[0]}]; got {desirable.dtype} {tuple(desirable.shape)}"
        )
    target = target.to(hidden.device)
    logps = token_log_probs(hidden, weight, target, bias, options).sums()
    ref = reference_logps(ref_logps, ref_hidden, ref_weight, ref_bias, target, options, per_token=False)
    if ref is None:
        raise ValueError("KTO needs a reference: ref_logps or a reference head (ref_hidden, ref_weight)")
    z = torch.as_tensor(0.0 if kl is None else kl, dtype=torch.float32, device=logps.device).detach()
    good = desirable.to(logps.device)
    logratios = logps - ref.to(logps.device)
    sign = torch.where(good, 1.0, -1.0)
    weights = torch.where(good, float(desirable_weight), float(undesirable_weight))
    losses = weights * (1.0 - torch.sigmoid(beta * sign * (logratios - z)))
    rewards = beta * logratios
    return AlignmentOutput(
        losses.mean(),
        detached(
            kl=z,
            **{
                "rewards/chosen": _masked_mean(rewards, good),
                "rewards/rejected": _masked_mean(rewards, ~good),
            },
        ),
    )


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)
