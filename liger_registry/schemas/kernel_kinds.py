"""The table of kernel kinds: the one place a kind is named; specs, patches, overrides and dispatch derive from it.

Torch-free and wiring-free: a kind says what it is; what installs it (its maker, its variants' makers, its check)
registers itself where it is defined, with ``@makes`` and ``@checks`` (liger_registry.modules.wiring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictBool, create_model

from liger_registry.schemas.base import StrictModel
from liger_registry.schemas.kernels import (
    ROPE_LAYOUTS,
    AddRmsNormSpec,
    GluSpec,
    KernelSpec,
    LayerNormSpec,
    ModuleKernelSpec,
    MoeExpertsSpec,
    RmsNormSpec,
    RopeSpec,
)

Scope = Literal["module forward", "module function"]

# The head's two losses: not `kernels:` kinds (their sections are `flce:` and `cross_entropy:`, read by the
# causal-LM forward), but overrides and liger keys of every family with a causal-LM head.
FLCE_KEY = "fused_linear_cross_entropy"
CE_KEY = "cross_entropy"


@dataclass(frozen=True)
class KernelKind:
    """One kind of kernel a family entry can declare under `kernels:`.

    `attributes`: spec fields whose values name attributes every target module must have. `patchable`: spec
    fields a policy may change (besides `enabled` and `reason`). `function_module`: where a module-function
    kind's function lives when it is not in the family's module. `activations`: for gated MLPs, the config
    activations the kernel computes. `method`: the method of the target classes a module-forward kind replaces.
    `variants`: ``(variant, op)`` for each option value that installs another maker, on `op` (the spec's
    ``variant`` names it). What installs the kind and each variant is registered in liger_registry.modules.wiring.
    """

    name: str
    spec: type[KernelSpec]
    scope: Scope
    description: str
    op: str = ""  # the kernel op decide_backend knows it by; "" = the kind's name
    liger_key: str | None = ""  # its liger_kernel_config key; "" = the kind's name, None = none
    attributes: tuple[str, ...] = ()
    patchable: tuple[str, ...] = ()
    function_module: str | None = None
    activations: tuple[str, ...] = ()
    method: str = "forward"
    variants: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for attr in ("op", "liger_key"):
            if getattr(self, attr) == "":
                object.__setattr__(self, attr, self.name)

    @property
    def module_forward(self) -> bool:
        return self.scope == "module forward"

    def op_for(self, spec: Any) -> str:
        """The kernel op the spec's options run on: its variant's, else the kind's own."""
        return dict(self.variants).get(spec.variant, self.op)

    def function_name(self, spec: Any) -> str:
        """What a module-function kind replaces: a name in the family's module, or in the kind's own module."""
        if self.function_module is None or ":" in spec.function:
            return spec.function
        return f"{self.function_module}:{spec.function}"


KINDS: dict[str, KernelKind] = {
    kind.name: kind
    for kind in (
        KernelKind(
            "rms_norm",
            RmsNormSpec,
            "module forward",
            "Fused RMSNorm on the listed norm classes.",
            attributes=("weight_attr", "eps_attr"),
            patchable=("casting_mode",),
        ),
        KernelKind(
            "add_rms_norm",
            AddRmsNormSpec,
            "module forward",
            "Residual add + post-attention RMSNorm fused in the listed llama-shaped decoder layers.",
            liger_key=None,
        ),
        KernelKind(
            "rope",
            RopeSpec,
            "module function",
            "Fused rotary embedding of q and k together, in the layout of the family's function.",
            variants=tuple((layout, "rope_variant") for layout in ROPE_LAYOUTS if layout != "rotate_half"),
        ),
        KernelKind(
            "swiglu",
            GluSpec,
            "module forward",
            "Fused silu(gate) * up in the listed MLP classes (gate and up read in place from a fused gate_up).",
            attributes=("gate", "up", "down", "limit", "gate_sparsity"),
            activations=("silu", "swish"),
            variants=(("gate_up", "glu_fused"),),
        ),
        KernelKind(
            "geglu",
            GluSpec,
            "module forward",
            "Fused gelu_tanh(gate) * up in the listed MLP classes (gate and up read in place from a fused gate_up).",
            attributes=("gate", "up", "down", "limit", "gate_sparsity"),
            activations=("gelu_pytorch_tanh", "gelu_tanh"),
            variants=(("gate_up", "glu_fused"),),
        ),
        KernelKind(
            "layer_norm",
            LayerNormSpec,
            "module forward",
            "Fused LayerNorm on the listed classes (offset 1: LayerNorm1P).",
            attributes=("eps_attr",),
            variants=(("1p", "layer_norm"),),
        ),
        KernelKind(
            "relu_squared",
            ModuleKernelSpec,
            "module forward",
            "Fused relu(x) ** 2 on the listed activation modules (ACT2FN['relu2']).",
        ),
        KernelKind(
            "swiglu_clamped",
            ModuleKernelSpec,
            "module forward",
            "GPT-OSS's clamped SwiGLU over interleaved gate/up pairs, in the experts' _apply_gate.",
            liger_key=None,
            attributes=(),
            method="_apply_gate",
        ),
        KernelKind(
            "moe_experts",
            MoeExpertsSpec,
            "module forward",
            "Grouped-GEMM MoE experts (one launch per GEMM over every expert, the gate fused into the gate/up "
            "GEMM, the routing weights into the down GEMM) in the listed experts classes.",
            liger_key=None,
            attributes=("gate_up", "down"),
        ),
    )
}

KERNEL_NAMES = tuple(KINDS)


def _optional(annotation: Any) -> Any:
    return annotation | None


def _patch_model(kind: KernelKind) -> type[StrictModel]:
    """What a policy may change about one kind: enabled, reason and the kind's patchable fields."""
    fields: dict[str, Any] = {
        "enabled": (StrictBool | None, Field(None, description="Turn the kernel on or off.")),
        "reason": (str | None, Field(None, description="Why.")),
    }
    for name in kind.patchable:
        spec_field = kind.spec.model_fields[name]
        fields[name] = (_optional(spec_field.annotation), Field(None, description=spec_field.description))
    model_name = "".join(part.title() for part in kind.name.split("_")) + "Patch"
    return create_model(
        model_name, __base__=StrictModel, __doc__=f"Policy changes to the {kind.name} kernel.", **fields
    )


PATCH_MODELS: dict[str, type[StrictModel]] = {name: _patch_model(kind) for name, kind in KINDS.items()}

KernelsSpec = create_model(
    "KernelsSpec",
    __base__=StrictModel,
    __doc__="Which kernels a family gets; a kernel left out is not installed.",
    **{name: (kind.spec | None, Field(None, description=kind.description)) for name, kind in KINDS.items()},
)

KernelsPatch = create_model(
    "KernelsPatch",
    __base__=StrictModel,
    __doc__="Per-kernel changes a policy makes.",
    **{
        name: (PATCH_MODELS[name] | None, Field(None, description=f"Changes to the {name} kernel."))
        for name in KINDS
    },
)
