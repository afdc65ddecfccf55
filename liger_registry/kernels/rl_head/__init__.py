"""The RL head: per-token log-probs of the targets and statistics of each token's next-token distribution
(entropy, log sum of squared probabilities, mean logit, whether the target is the first argmax) from hidden
states and the head weight in one pass over the vocabulary per tile, never the [N, V] logits.

* :func:`fused_linear_logprobs` -> :class:`RlHeadOutput`; ``log_probs`` and ``entropy`` are differentiable in
  hidden, weight and bias, the other fields are not.
* ``op``: the custom ops ``rl_head_fwd`` / ``rl_head_bwd`` and the backend Op ``FUSED_LINEAR_LOGPROBS``;
  ``reference``: the PyTorch twin and the full-logits reference; ``triton_kernels``: the fold and gradient kernels;
  ``stats``: the per-token running state and the outputs made from it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import torch

from ..flce.op import check_head_shapes
from .op import FUSED_LINEAR_LOGPROBS, tile_plan
from .stats import OUTPUTS, flags_of

__all__ = ["OUTPUTS", "RlHeadOutput", "fused_linear_logprobs", "tile_plan"]


class RlHeadOutput(NamedTuple):
    """Per-token fp32 [N] fields (``is_top1`` bool); a field not asked for is None."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    log_sum_sq_probs: torch.Tensor | None
    mean_logits: torch.Tensor | None
    is_top1: torch.Tensor | None


def _check(hidden, weight, target, bias, temperature, softcap, logit_scale) -> None:
    check_head_shapes(hidden, weight, target, bias)
    if target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"target must hold token ids (int64), got {target.dtype}")
    for name, value in (("temperature", temperature), ("logit_scale", logit_scale), ("softcap", softcap)):
        if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not temperature > 0 or (softcap is not None and not softcap > 0):
        raise ValueError(f"temperature and softcap must be > 0, got {temperature!r} and {softcap!r}")


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    outputs: Iterable[str] = ("log_probs", "entropy"),
    max_tile_mib: float | None = None,
) -> RlHeadOutput:
    """Per-token statistics of ``softmax(z)`` with ``z = softcap * tanh(logit_scale * x / softcap) / temperature``
    (``logit_scale * x / temperature`` without a softcap), ``x = hidden @ weight.T + bias``; ``hidden`` [N, H],
    ``target`` [N] in ``[0, V)``. ``outputs``: names among :data:`OUTPUTS` (``log_probs`` always). Under autocast
    the GEMMs run in the autocast dtype. ``max_tile_mib``: the logits tile budget (:func:`tile_plan`)."""
    _check(hidden, weight, target, bias, temperature, softcap, logit_scale)
    flags = flags_of(outputs)
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        hidden = hidden.to(torch.get_autocast_dtype(device))
    t = float(temperature)
    cap = None if softcap is None else float(softcap) / t
    scale = float(logit_scale) / t
    plan = tile_plan(hidden.shape[0], weight.shape[0], hidden.element_size(), max_tile_mib)
    target = target.to(torch.int64).contiguous()
    with torch.autocast(device, enabled=False):
        out = FUSED_LINEAR_LOGPROBS(hidden, weight, bias, target, cap, scale, flags.mask, *plan)
    lp, ent, sq, mean, top1, *_ = out
    return RlHeadOutput(
        lp,
        ent if flags.entropy else None,
        sq if flags.log_sum_sq_probs else None,
        mean if flags.mean_logits else None,
        top1 if flags.is_top1 else None,
    )
