"""HeadOptions: how the fused head turns hidden states into log-probs (masking, temperature, logit transform,
chunk budget), shared by every alignment loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from liger_registry.constants import IGNORE_INDEX
from liger_registry.kernels.flce.options import FlceOptions


@dataclass(frozen=True)
class HeadOptions:
    """Keyword options every alignment loss accepts (unknown names are a TypeError).

    ``ignore_index``: target value of tokens that do not count. ``temperature``: logits are divided by it
    (GRPO samples at a temperature). ``softcap`` / ``logit_scale``: the model's own logit transform
    (``softcap * tanh(logits * logit_scale / softcap)``). ``chunk_mem_const`` / ``max_chunk_mib``: the chunk
    budget of the fused head (FLCE's knobs; one chunk of logits exists at a time). ``accum_dtype``: dtype of
    the weight-gradient accumulator.
    """

    ignore_index: int = IGNORE_INDEX
    temperature: float = 1.0
    softcap: float | None = None
    logit_scale: float = 1.0
    chunk_mem_const: int | None = None
    max_chunk_mib: float | None = None
    accum_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {t!r}")
        self.flce()  # FlceOptions validates the rest

    def flce(self) -> FlceOptions:
        """The FLCE options that give per-token negative log-probs (``reduction="none"``) of
        ``softcap(logits * logit_scale) / temperature``: ``c tanh(x s / c) / T`` is ``c' tanh(x s' / c')`` with
        ``c' = c / T`` and ``s' = s / T``, so the temperature folds into both."""
        t = float(self.temperature)
        return FlceOptions(
            ignore_index=self.ignore_index,
            softcap=None if self.softcap is None else float(self.softcap) / t,
            logit_scale=float(self.logit_scale) / t,
            reduction="none",
            accum_dtype=self.accum_dtype,
            chunk_mem_const=self.chunk_mem_const,
            max_chunk_mib=self.max_chunk_mib,
        )
