"""Gated-MLP module forwards: SwiGLU / GeGLU over separate gate and up projections (with Falcon-H1's gate and down
multipliers) or one fused gate_up (the projections stay, the split and activation-times-up are one kernel), GPT-OSS's
clamped experts gate, relu²."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from liger_registry import kernels
from liger_registry.kernels.glu import glu_fused, relu_squared, swiglu_clamped
from liger_registry.modules.wiring import checks, makes
from liger_registry.schemas import GluSpec

# The MLP method that applies gate_sparsity (transformers' name in Gemma3nTextMLP).
SPARSITY_METHOD = "_gaussian_topk"
# Where transformers' MLPs keep their activation module, and what each GLU kind computes in its place.
ACT_ATTRS = ("act_fn", "act", "activation_fn")
KIND_ACTIVATIONS: dict[str, Callable] = {
    "swiglu": F.silu,
    "geglu": lambda x: F.gelu(x, approximate="tanh"),
}


def _clamped(gate_out, up_out, limit):
    """DeepseekV4MLP's clamps (exact, so done where it does them, before the kernel): the gate above at
    ``limit``, up to ``[-limit, limit]``."""
    if limit is None:
        return gate_out, up_out
    return gate_out.clamp(max=limit), up_out.clamp(min=-limit, max=limit)


def _glu_forward(spec: GluSpec, fused: Callable) -> Callable:
    """``down(act(gate(x) * gate_multiplier) * up(x)) * down_multiplier``; the multipliers are the MLP's own
    ``gate_multiplier`` / ``down_multiplier`` (FalconH1MLP's ``config.mlp_multipliers``), 1.0 for an MLP without
    them. The gate multiplier runs in the kernel; the down one multiplies the down projection's output, as
    FalconH1MLP does: moved before the projection it would round elsewhere in half precision and scale no bias.
    With ``spec.limit``, gate and up are clamped at the MLP's limit first; with ``spec.gate_sparsity``, the gate
    of an MLP whose sparsity is above 0 goes through the MLP's own ``_gaussian_topk`` first."""
    gate, up, down, limit, sparsity = spec.gate, spec.up, spec.down, spec.limit, spec.gate_sparsity

    def forward(self, x):
        g, u = getattr(self, gate)(x), getattr(self, up)(x)
        # the projections' outputs are this call's own: the backward may write their gradients over them, unless
        # an op between saved them (the sparsity's relu keeps its output)
        projected = True
        if limit is not None:
            g, u = _clamped(g, u, getattr(self, limit))
        if sparsity is not None and getattr(self, sparsity) > 0.0:
            g, projected = getattr(self, SPARSITY_METHOD)(g), False
        h = fused(g, u, gate_multiplier=getattr(self, "gate_multiplier", 1.0), in_place_backward=projected)
        out = getattr(self, down)(h)
        down_multiplier = getattr(self, "down_multiplier", 1.0)
        return out if down_multiplier == 1.0 else out * down_multiplier

    return forward


def activation_problem(kind: str, target) -> str | None:
    """Why an MLP instance's own activation module is not the kernel's activation, or None (a class, or an MLP
    without one). The plan checks the config's activation name; this checks each module, which matters where a
    sub-model's config (a vision tower's) names its own activation."""
    if isinstance(target, type):
        return None
    attr = next((a for a in ACT_ATTRS if callable(getattr(target, a, None))), None)
    if attr is None:
        return None
    probe = torch.linspace(-6.0, 6.0, 97)
    act = getattr(target, attr)
    try:
        with torch.no_grad():
            same = torch.allclose(act(probe), KIND_ACTIVATIONS[kind](probe), rtol=1e-5, atol=1e-6)
    except (RuntimeError, TypeError) as exc:
        return f"{type(target).__name__}.{attr} ({type(act).__name__}) fails on a probe input: {exc}"
    if same:
        return None
    return f"{type(target).__name__}.{attr} is {type(act).__name__}, not the {kind} kernel's activation"


def sparsity_problem(spec: GluSpec, target) -> str | None:
    """Why an MLP class cannot take ``gate_sparsity``: it has no ``_gaussian_topk`` to call."""
    cls = target if isinstance(target, type) else type(target)
    if spec.gate_sparsity is None or callable(getattr(cls, SPARSITY_METHOD, None)):
        return None
    return f"{cls.__name__} has no {SPARSITY_METHOD} method for gate_sparsity {spec.gate_sparsity!r}"


@checks("swiglu")
def swiglu_problem(spec: GluSpec, entry, target, resolve_class) -> str | None:
    return sparsity_problem(spec, target) or activation_problem("swiglu", target)


@checks("geglu")
def geglu_problem(spec: GluSpec, entry, target, resolve_class) -> str | None:
    return sparsity_problem(spec, target) or activation_problem("geglu", target)


@makes("swiglu")
def swiglu_forward(spec: GluSpec) -> Callable:
    return _glu_forward(spec, kernels.swiglu)


@makes("geglu")
def geglu_forward(spec: GluSpec) -> Callable:
    return _glu_forward(spec, kernels.geglu)


def gate_up_mlp_forward(kind: str, gate_up: str = "gate_up_proj", down: str = "down_proj"):
    """Forward of an MLP with one fused ``gate_up_proj`` (gate = first half): ``Phi3MLP``, ``GlmMLP``,
    ``Glm4MLP`` ``.forward``; the projections stay, the split and activation-times-up are one kernel."""

    def forward(self, hidden_states):
        return getattr(self, down)(glu_fused(getattr(self, gate_up)(hidden_states), kind))

    return forward


def experts_apply_gate(kind: str):
    """``_apply_gate`` of the transformers experts with a fused ``gate_up_proj`` (the default one of
    ``integrations.moe``: ``act_fn(gate) * up`` after ``chunk(2, -1)``), which the batched_mm / grouped_mm
    experts implementations call between the expert GEMMs (qwen2_moe, qwen3_moe, qwen3_5_moe, mixtral, ...;
    their eager loop inlines the split and is not served by this)."""

    def apply_gate(self, gate_up):
        return glu_fused(gate_up, kind)

    return apply_gate


def gpt_oss_apply_gate(self, gate_up):
    """``GptOssExperts._apply_gate``: every experts implementation of transformers (eager loop, batched and
    grouped mm) calls it between the expert GEMMs, which stay as they are."""
    return swiglu_clamped(gate_up, self.limit, self.alpha)


def relu_squared_forward(self, input):
    """``ReLUSquaredActivation.forward`` (``ACT2FN["relu2"]``, nemotron's MLP activation)."""
    return relu_squared(input)


@makes("swiglu", variant="gate_up")
def swiglu_gate_up_forward(spec):
    """The swiglu kind's maker when the spec names a fused ``gate_up``."""
    return gate_up_mlp_forward("swiglu", spec.gate_up, spec.down)


@makes("geglu", variant="gate_up")
def geglu_gate_up_forward(spec):
    """The geglu kind's maker when the spec names a fused ``gate_up``."""
    return gate_up_mlp_forward("geglu", spec.gate_up, spec.down)


@makes("relu_squared")
def relu_squared_module_forward(spec):
    """The relu_squared kind's maker: every target is an activation module, nothing to read from the spec."""
    return relu_squared_forward


@makes("swiglu_clamped")
def clamped_apply_gate(spec):
    """The swiglu_clamped kind's maker: GPT-OSS's experts' ``_apply_gate`` (limit and alpha from the module)."""
    return gpt_oss_apply_gate
