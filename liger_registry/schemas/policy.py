"""Schema of a policy file: an override layer for the families it names."""

from __future__ import annotations

from pydantic import Field, StrictBool, create_model

from liger_registry.limits import ChunkConst
from liger_registry.schemas.base import StrictModel
from liger_registry.schemas.family import ONE_BUDGET, SkipLogitsMode, flce_fields
from liger_registry.schemas.kernel_kinds import KernelsPatch

FlcePatch = create_model(
    "FlcePatch",
    __base__=StrictModel,
    __doc__="FLCE knobs a policy may set; a budget knob set clears the other of lower layers.",
    __validators__=ONE_BUDGET,
    enabled=(StrictBool | None, Field(None, description="Use FLCE for the training loss.")),
    **flce_fields(patch=True),
)


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
