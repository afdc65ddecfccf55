"""Schema of a policy file: an override layer for the families it names."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, model_validator

from liger_registry.schemas.base import StrictModel
from liger_registry.schemas.family import (
    AccumDtype,
    ChunkConst,
    FlceStrategy,
    Mib,
    SkipLogitsMode,
    Smoothing,
    ZLossScale,
    one_budget,
)
from liger_registry.schemas.kernel_kinds import KernelsPatch


class FlcePatch(StrictModel):
    """FLCE knobs a policy may set."""

    enabled: StrictBool | None = Field(None, description="Use FLCE for the training loss.")
    chunk_mem_const: ChunkConst | None = Field(
        None, description="FLCE chunk constant C; clears max_chunk_mib of lower layers."
    )
    max_chunk_mib: Mib | None = Field(
        None, description="FLCE logits-buffer budget in MiB; clears chunk_mem_const of lower layers."
    )
    strategy: FlceStrategy | None = Field(None, description="FLCE chunking strategy: auto, tokens or vocab.")
    lse_square_scale: ZLossScale | None = Field(None, description="FLCE z-loss scale (>= 0).")
    label_smoothing: Smoothing | None = Field(None, description="FLCE label smoothing, in [0, 1].")
    accum_dtype: AccumDtype | None = Field(None, description="float32: accumulate dW in fp32.")
    use_token_scaling: StrictBool | None = Field(
        None, description="Scale each token's loss by its detached predicted probability."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_budget(cls, data: Any) -> Any:
        return one_budget(data)


class CrossEntropyPatch(StrictModel):
    """The head's cross-entropy switch, as a policy may set it."""

    enabled: StrictBool | None = Field(None, description="Cross entropy of the logits by our kernel.")
    reason: str | None = Field(None, description="Why.")


class JsdPatch(StrictModel):
    """Distillation-loss knobs a policy may set."""

    chunk_mem_const: ChunkConst | None = Field(None, description="JSD chunk constant.")


class PolicyFile(StrictModel):
    """An override layer: each knob it sets wins over the family entry for the families in applies_to."""

    policy: str = Field(..., description="Policy name, shown as the provenance of what it sets.")
    applies_to: list[str] = Field(..., min_length=1, description="Family names it applies to; '*' for all.")
    reason: str = Field(..., description="Why the policy exists.")
    opt_in: StrictBool = Field(
        False,
        description="A registry policy applied only when named (apply(model, policy='NAME')), never by default.",
    )
    kernels: KernelsPatch | None = Field(None, description="Per-kernel changes.")
    flce: FlcePatch | None = Field(None, description="Fused linear cross entropy knobs.")
    cross_entropy: CrossEntropyPatch | None = Field(None, description="The head's cross-entropy switch.")
    fused_linear_jsd: JsdPatch | None = Field(None, description="Distillation-loss knobs.")
    skip_logits: SkipLogitsMode | None = Field(
        None, description="The skip_logits default for these families."
    )

    def applies(self, family: str) -> bool:
        return "*" in self.applies_to or family in self.applies_to
