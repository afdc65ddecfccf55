"""Per-token log-probs of the target tokens through the fused head, chunked: the one place the alignment losses
touch the vocabulary.

``log p(target | hidden)`` is ``-FLCE(reduction="none")``: the forward runs chunk by chunk and keeps only
the inputs, the backward recomputes each chunk's logits with the per-token gradient, so at most one chunk of
logits exists at a time, in the forward and in the backward. Tokens whose target is ``ignore_index`` are not
sent through the head at all (prompt and padding tokens cost nothing).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from liger_registry.constants import IGNORE_INDEX
from liger_registry.kernels import fused_linear_cross_entropy

from .head_options import HeadOptions


class TokenLogProbs(NamedTuple):
    """``values`` [B, T] fp32: log-prob of each target token, 0 where masked; ``mask`` [B, T] bool."""

    values: torch.Tensor
    mask: torch.Tensor

    def sums(self) -> torch.Tensor:
        """[B]: the log-prob of each sequence (sum over its tokens)."""
        return self.values.sum(-1)

    def means(self) -> torch.Tensor:
        """[B]: the length-normalised log-prob (mean over its tokens; 0 for a sequence without any)."""
        return self.sums() / self.counts().clamp(min=1)

    def counts(self) -> torch.Tensor:
        """[B]: the number of tokens that count, as fp32."""
        return self.mask.sum(-1).to(torch.float32)


def next_token_target(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Targets aligned with the hidden states from HF-style ``labels`` [B, T] (unshifted, as passed to a
    causal LM): position t predicts ``labels[:, t + 1]``; the last position predicts nothing."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _check(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias) -> None:
    if hidden.dim() != 3 or target.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be [B, T, H] and target [B, T]; got {tuple(hidden.shape)} and {tuple(target.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[2]:
        raise ValueError(f"weight must be [V, H={hidden.shape[2]}]; got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [V={weight.shape[0]}]; got {tuple(bias.shape)}")
    if target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must hold token ids (int64), got {target.dtype}")


def token_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    options: HeadOptions | None = None,
    **head_options,
) -> TokenLogProbs:
    """Log-probs [B, T] of ``target`` [B, T] under ``softcap((hidden @ weight.T + bias) * scale) / T`` with
    ``hidden`` [B, T, H], differentiable in hidden, weight and bias, never materialising [B*T, V].
    Options: one :class:`HeadOptions` or its fields as keywords."""
    options = _options(options, head_options)
    _check(hidden, weight, target, bias)
    target = target.to(device=hidden.device, dtype=torch.int64)
    mask = target != options.ignore_index
    flat_mask = mask.reshape(-1)
    # the gather is [N_valid, H]: a copy of the hidden states that count, much smaller than their logits
    rows = hidden.reshape(-1, hidden.shape[-1])[flat_mask]
    nll = fused_linear_cross_entropy(
        rows, weight, target.reshape(-1)[flat_mask], bias, options=options.flce()
    )
    values = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    values = values.masked_scatter(mask, -nll.to(torch.float32))
    return TokenLogProbs(values, mask)


@torch.no_grad()
def reference_log_probs(
    hidden: torch.Tensor | None,
    weight: torch.Tensor | None,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    options: HeadOptions | None = None,
    **head_options,
) -> TokenLogProbs:
    """:func:`token_log_probs` of a frozen reference head (no graph, no gradients)."""
    options = _options(options, head_options)
    if hidden is None or weight is None:
        raise ValueError("a reference head needs both ref_hidden and ref_weight")
    return token_log_probs(hidden.detach(), weight.detach(), target, _detach(bias), options)


def _options(options: HeadOptions | None, fields: dict) -> HeadOptions:
    if options is not None and fields:
        raise TypeError(f"pass options= or its fields ({', '.join(fields)}), not both")
    return options if options is not None else HeadOptions(**fields)


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()
