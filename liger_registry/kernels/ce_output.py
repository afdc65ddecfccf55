"""CrossEntropyOutput: what cross_entropy and fused_linear_cross_entropy return when a ``return_*`` flag is set."""

from __future__ import annotations

from typing import NamedTuple

import torch


class CrossEntropyOutput(NamedTuple):
    """Returned when any ``return_*`` flag is set; fields not asked for are ``None``.

    ``token_accuracy``: the fraction (fp32) of non-ignored tokens whose argmax is the target (0 when none counts);
    ``predicted_tokens``: the argmax of each row, -1 on ignored rows (the reference library's convention)."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None
    token_accuracy: torch.Tensor | None
    predicted_tokens: torch.Tensor | None


def argmax_mode_for(return_token_accuracy: bool, return_predicted_tokens: bool) -> int:
    """The row kernels' argmax mode a call needs: 1 (non-ignored rows) when either field is asked for, else 0."""
    return 1 if (return_token_accuracy or return_predicted_tokens) else 0


def predicted_tokens(argmax: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The row argmax with -1 on ignored rows (whatever the kernel left there)."""
    return argmax.masked_fill(target == ignore_index, -1)


def token_accuracy(predicted: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Fraction of non-ignored rows predicted right, fp32 (0 when every row is ignored), no host sync."""
    valid = target != ignore_index
    n_correct = ((predicted == target) & valid).sum()
    return n_correct.to(torch.float32) / valid.sum().clamp(min=1)


def ce_output(
    loss: torch.Tensor,
    z_loss: torch.Tensor,
    accuracy: torch.Tensor | None,
    predicted: torch.Tensor | None,
    *,
    return_z_loss: bool,
    return_token_accuracy: bool,
    return_predicted_tokens: bool,
):
    """The loss alone, or a :class:`CrossEntropyOutput` with the fields asked for."""
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return loss
    return CrossEntropyOutput(
        loss,
        z_loss if return_z_loss else None,
        accuracy if return_token_accuracy else None,
        predicted if return_predicted_tokens else None,
    )
