"""The reference model's log-probs of a loss: given by the caller, or computed from a frozen reference head."""

from __future__ import annotations

import torch

from .head_options import HeadOptions
from .logprobs import reference_log_probs


def reference_logps(
    given: torch.Tensor | None,
    ref_hidden: torch.Tensor | None,
    ref_weight: torch.Tensor | None,
    ref_bias: torch.Tensor | None,
    target: torch.Tensor,
    options: HeadOptions,
    *,
    per_token: bool,
) -> torch.Tensor | None:
    """Detached reference log-probs: per sequence [B] (sums), or per token [B, T] with ``per_token``.

    ``given`` (precomputed, e.g. TRL's ``ref_chosen_logps``) or the reference head (``ref_hidden`` [B, T, H'],
    ``ref_weight`` [V, H'], ``ref_bias``) — not both; None when neither is passed.
    """
    has_head = ref_hidden is not None or ref_weight is not None or ref_bias is not None
    if given is not None and has_head:
        raise ValueError(
            "pass the reference log-probs or the reference head (ref_hidden, ref_weight), not both"
        )
    if given is not None:
        shape = tuple(target.shape) if per_token else (target.shape[0],)
        if tuple(given.shape) != shape:
            raise ValueError(f"reference log-probs must be {list(shape)}; got {list(given.shape)}")
        return given.detach().to(device=target.device, dtype=torch.float32)
    if not has_head:
        return None
    logps = reference_log_probs(ref_hidden, ref_weight, target, ref_bias, options)
    return logps.values if per_token else logps.sums()
