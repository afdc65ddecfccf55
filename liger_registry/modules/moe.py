"""MoE experts module forward: a transformers experts module (``use_experts_implementation``: stacked gate/up and
down weights, ``forward(hidden_states, top_k_index, top_k_weights)``) on the grouped-GEMM kernel, its parameters
read in place (names, state dict, PEFT and FSDP untouched). The router and everything around the experts stay
transformers' code."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from liger_registry.kernels.moe import moe_experts
from liger_registry.modules.wiring import checks, makes
from liger_registry.schemas import MoeExpertsSpec

# the gates that are an experts class's own _apply_gate (with the module's limit), not transformers' default
OWN_GATES = ("clamped_swiglu", "limited_swiglu")

_UNSERVED = {
    "has_gate": (False, "ungated experts (act_fn(up) only)"),
    "has_post_expert_norm": (True, "a norm after each expert"),
    "_is_expert_parallel": (True, "expert parallelism (sentinel expert ids)"),
}


def _unserved(module: nn.Module) -> list[str]:
    return [why for attr, (bad, why) in _UNSERVED.items() if getattr(module, attr, not bad) == bad]


def _weight(module: nn.Module, name: str) -> torch.Tensor:
    weight = getattr(module, name)
    if not isinstance(weight, torch.Tensor) or not weight.dtype.is_floating_point or weight.dim() != 3:
        raise TypeError(
            f"{type(module).__name__}.{name} is not a stacked [E, out, in] floating-point weight "
            f"({type(weight).__name__}): quantised experts are not served by moe_experts; turn the kernel off"
        )
    return weight


def experts_forward(
    module: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate: str = "swiglu",
    gate_up: str = "gate_up_proj",
    down: str = "down_proj",
) -> torch.Tensor:
    """What ``module``'s experts forward returns, computed by :func:`~liger_registry.kernels.moe.moe_experts`."""
    if problems := _unserved(module):
        raise NotImplementedError(
            f"{type(module).__name__}: moe_experts does not serve {', '.join(problems)}; turn the kernel off "
            "(policy kernels.moe_experts.enabled: false) for this run"
        )
    bias = getattr(module, "has_bias", False)
    clamped = gate in OWN_GATES
    return moe_experts(
        hidden_states,
        top_k_index,
        top_k_weights,
        _weight(module, gate_up),
        _weight(module, down),
        getattr(module, f"{gate_up}_bias") if bias else None,
        getattr(module, f"{down}_bias") if bias else None,
        act=gate,
        limit=module.limit if clamped else 0.0,
        alpha=module.alpha if gate == "clamped_swiglu" else 0.0,
        transposed=getattr(module, "is_transposed", False),
    )


@makes("moe_experts")
def moe_experts_forward(spec: MoeExpertsSpec) -> Callable:
    gate, gate_up, down = spec.gate, spec.gate_up, spec.down

    # GptOssExperts names the routing arguments router_indices / routing_weights; the others top_k_index /
    # top_k_weights: a caller passing them by keyword reaches the kernel under either name.
    def forward(
        self, hidden_states, top_k_index=None, top_k_weights=None, router_indices=None, routing_weights=None
    ):
        index = top_k_index if top_k_index is not None else router_indices
        weights = top_k_weights if top_k_weights is not None else routing_weights
        if index is None or weights is None:
            raise TypeError(f"{type(self).__name__}.forward: the routing indices and weights are required")
        return experts_forward(self, hidden_states, index, weights, gate, gate_up, down)

    return forward


def transformers_default_gate() -> Callable | None:
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # pragma: no cover - every supported release has it
        return None
    return _default_apply_gate


@checks("moe_experts")
def moe_experts_problem(spec: MoeExpertsSpec, entry, target, resolve_class) -> str | None:
    """Why the kernel cannot replace this experts class's forward; None when it can: the class must be one
    transformers' ``use_experts_implementation`` wraps, and its ``_apply_gate`` must be the gate the spec names
    (transformers' default split gate for swiglu / geglu, the class's own for the OWN_GATES)."""
    cls = target if isinstance(target, type) else type(target)
    apply_gate = getattr(cls, "_apply_gate", None)
    if apply_gate is None or not hasattr(cls.forward, "__wrapped__"):
        return f"{cls.__name__} is not a transformers experts module (use_experts_implementation)"
    default = transformers_default_gate()
    if spec.gate in OWN_GATES and apply_gate is default:
        return f"{cls.__name__} uses transformers' default gate (act(gate) * up), not {spec.gate}"
    if spec.gate not in OWN_GATES and default is not None and apply_gate is not default:
        return (
            f"{cls.__name__} overrides _apply_gate ({apply_gate.__qualname__}): its gate is not {spec.gate}"
        )
    if not isinstance(target, type) and (problems := _unserved(target)):
        return f"{cls.__name__}: {', '.join(problems)} not served"
    return None
