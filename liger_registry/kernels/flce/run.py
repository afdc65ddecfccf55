"""FlceRun: what one FLCE call runs (options, planned strategy and chunk, decided backend), flattened for torch.library."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .options import FlceOptions

# the fields of FlceOptions the computation reads (the budget knobs and the strategy live on in the plan)
LOSS_FIELDS = (
    "ignore_index",
    "label_smoothing",
    "softcap",
    "logit_scale",
    "lse_square_scale",
    "reduction",
    "accum_dtype",
    "use_token_scaling",
)


@dataclass(frozen=True)
class FlceRun:
    """One call's computation: ``strategy`` is ``"tokens"`` (``chunk`` rows per chunk) or ``"vocab"``
    (``chunk`` vocabulary columns per chunk); ``argmax_mode`` 0: none, 1: valid rows, 2: every row."""

    options: FlceOptions
    strategy: str
    chunk: int
    backend: str
    argmax_mode: int = 0

    def flat(self) -> tuple:
        """The positional arguments of the custom op (its schema has no dataclasses)."""
        o = self.options
        return (
            *(getattr(o, f) for f in LOSS_FIELDS),
            self.strategy,
            self.chunk,
            self.backend,
            self.argmax_mode,
        )

    @classmethod
    def from_flat(
        cls,
        ignore_index: int,
        label_smoothing: float,
        softcap: float | None,
        logit_scale: float,
        lse_square_scale: float,
        reduction: str,
        accum_dtype: torch.dtype | None,
        use_token_scaling: bool,
        strategy: str,
        chunk: int,
        backend: str,
        argmax_mode: int,
    ) -> FlceRun:
        options = FlceOptions(
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            softcap=softcap,
            logit_scale=logit_scale,
            lse_square_scale=lse_square_scale,
            reduction=reduction,
            accum_dtype=accum_dtype,
            use_token_scaling=use_token_scaling,
        )
        return cls(options, strategy, chunk, backend, argmax_mode)
