"""Numerical decisions: which formula a module computes, checked against our kernels' torch implementations."""

from __future__ import annotations

import copy
import inspect
import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from liger_registry.kernels.glu import GLU_KINDS
from liger_registry.kernels.glu.reference import (
    geglu_torch,
    glu_fused_torch,
    relu_squared_torch,
    swiglu_clamped_torch,
    swiglu_torch,
)
from liger_registry.kernels.norm.reference import rms_norm_torch
from liger_registry.modules.glu import SPARSITY_METHOD
from liger_registry.scaffold.inspect import Captured
from liger_registry.schemas import KINDS
from liger_registry.schemas.kernels import ROPE_LAYOUTS, RopeSpec

EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")
GLU_PROJECTIONS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("gate", "up", "down"))
FUSED_GLU = ("gate_up_proj", "gate_up")
# Module attributes that may hold a clamp limit of the gate and up (DeepseekV4MLP's `limit`).
GLU_LIMITS = ("limit", "swiglu_limit")
# Module attributes that may hold an activation-sparsity target applied by the module's own top-k
# (Gemma3nTextMLP's `activation_sparsity`, GluSpec.gate_sparsity).
GLU_SPARSITIES = ("activation_sparsity",)
ACT_CONFIG_ATTRS = ("hidden_act", "hidden_activation", "activation_function")
FP32_TOL = 1e-5


@dataclass
class Verdict:
    """What one candidate class (or function) computes: a kernel spec when it matches, else why not."""

    kernel: str
    target: str
    spec: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None  # set when the kernel cannot serve this target

    @property
    def ok(self) -> bool:
        return self.reason is None


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / (1 + want.abs().max()))


def _input(captured: Captured, index: int, width: int) -> torch.Tensor:
    for args in captured.inputs[index:] + captured.inputs:
        if args and torch.is_tensor(args[0]) and args[0].shape[-1] == width and args[0].is_floating_point():
            return args[0].float()
    return torch.randn(2, 5, width, generator=torch.Generator().manual_seed(index))


def _eps_attr(module: nn.Module) -> str | None:
    return next((a for a in EPS_ATTRS if isinstance(getattr(module, a, None), float)), None)


def _with_random_weight(module: nn.Module, seed: int) -> nn.Module:
    module = copy.deepcopy(module).float()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    return module


def _norm_weight(module: nn.Module) -> torch.Tensor | None:
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, nn.Parameter) and weight.dim() == 1 else None


def _forward_inputs(cls: type) -> list[str]:
    """The forward's parameters after self, other than *args/**kwargs."""
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def decide_rms_norm(captured: Captured) -> Verdict:
    """offset (0 or 1: Gemma stores weight - 1) from fp32, casting mode from bf16 against rms_norm_torch."""
    name = captured.cls.__name__
    verdict = Verdict("rms_norm", captured.target or name)
    scaled = [m for m in captured.instances if _norm_weight(m) is not None]
    if not scaled:
        verdict.reason = f"{name} has no 1-D weight parameter on any instance (a scale-free norm)"
        return verdict
    eps_attr = _eps_attr(scaled[0])
    if len(_forward_inputs(captured.cls)) > 1:
        verdict.reason = f"{name}'s forward takes {', '.join(_forward_inputs(captured.cls))} (a gated norm); the kernel takes x"
        return verdict
    if eps_attr is None or any(_eps_attr(m) != eps_attr for m in captured.instances):
        verdict.reason = f"{name} keeps epsilon in none of {', '.join(EPS_ATTRS)} as a float"
        return verdict
    offsets, modes = set(), {}
    for index, instance in enumerate(scaled[:3]):
        module = _with_random_weight(instance, index)
        x = _input(captured, index, module.weight.shape[0])
        try:
            with torch.no_grad():
                want = module(x)
        except TypeError as exc:
            verdict.reason = f"{name}'s forward needs more than the hidden states (a gated norm?): {exc}"
            return verdict
        eps = getattr(module, eps_attr)
        errs = {o: rel_err(rms_norm_torch(x, module.weight, eps, o, "gemma"), want) for o in (0.0, 1.0)}
        offset = min(errs, key=errs.get)
        if errs[offset] > FP32_TOL:
            like = (
                "a LayerNorm (it subtracts the mean)"
                if _is_layer_norm(module, x, want, eps)
                else "not RMSNorm"
            )
            verdict.reason = (
                f"{name} does not compute x / rms(x) * (offset + weight) for offset 0 or 1 in fp32 "
                f"(best max rel diff {errs[offset]:.2g}): {like}"
            )
            return verdict
        offsets.add(offset)
        mode, err = _casting_mode(module, x, eps, offset)
        modes[mode] = max(err, modes.get(mode, 0.0))
    if len(offsets) > 1 or len(modes) > 1:
        verdict.reason = (
            f"{name}'s instances disagree on the formula (offsets {offsets}, casting {sorted(modes)})"
        )
        return verdict
    verdict.spec = {"casting_mode": next(iter(modes)), "offset": offsets.pop(), "eps_attr": eps_attr}
    unscaled = [m for m in captured.instances if _norm_weight(m) is None]
    if unscaled:
        if (problem := _unscaled_problem(unscaled, eps_attr)) is not None:
            verdict.spec = {}
            verdict.reason = f"{name}: {problem}"
            return verdict
        verdict.spec["weight_optional"] = True
    return verdict


def _unscaled_problem(modules: list[nn.Module], eps_attr: str) -> str | None:
    """Why the instances without a weight (Gemma 4's ``with_scale=False``) are not ``x / rms(x)`` in fp32, or None.
    Without a weight any width serves as the probe."""
    for index, module in enumerate(modules[:3]):
        if not isinstance(getattr(module, eps_attr, None), float):
            return f"an instance without a weight keeps no epsilon in {eps_attr}"
        x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(index))
        try:
            with torch.no_grad():
                err = rel_err(rms_norm_torch(x, None, getattr(module, eps_attr)), module(x))
        except (RuntimeError, TypeError) as exc:
            return f"an instance without a weight fails on a probe input: {exc}"
        if err > FP32_TOL:
            return f"an instance without a weight does not compute x / rms(x) (max rel diff {err:.2g})"
    return None


def _casting_mode(module: nn.Module, x: torch.Tensor, eps: float, offset: float) -> tuple[str, float]:
    """The casting mode whose bf16 result is closest to the module's own bf16 output (ties: llama first)."""
    low, xb = copy.deepcopy(module).to(torch.bfloat16), x.to(torch.bfloat16)
    with torch.no_grad():
        want = low(xb)
    errs = {
        m: rel_err(rms_norm_torch(xb, low.weight, eps, offset, m), want) for m in ("llama", "gemma", "none")
    }
    mode = min(errs, key=errs.get)
    return mode, errs[mode]


def _is_layer_norm(module: nn.Module, x: torch.Tensor, want: torch.Tensor, eps: float) -> bool:
    bias = getattr(module, "bias", None)
    return rel_err(F.layer_norm(x, (x.shape[-1],), module.weight, bias, eps), want) <= FP32_TOL


def decide_layer_norm(captured: Captured) -> Verdict:
    """A LayerNorm class with a 1-D weight and an epsilon attribute that computes F.layer_norm with the weight,
    or with weight + 1 (LayerNorm1P: offset 1), and with its bias where it has one: the kernel adds a bias only
    where the module holds one (Cohere's LayerNorm has none), so a missing bias is no reason to leave it off."""
    name, first = captured.cls.__name__, captured.instances[0]
    verdict = Verdict("layer_norm", captured.target or name)
    weight, eps_attr = _norm_weight(first), _eps_attr(first)
    if weight is None or eps_attr is None:
        missing = [n for n, v in (("1-D weight", weight), ("epsilon", eps_attr)) if v is None]
        verdict.reason = f"{name} has no {', '.join(missing)} (the kernel needs weight and eps)"
        return verdict
    offsets = set()
    for index, instance in enumerate(captured.instances[:3]):
        module = _with_random_weight(instance, index)
        bias = module.bias if isinstance(getattr(module, "bias", None), nn.Parameter) else None
        x = _input(captured, index, module.weight.shape[0])
        with torch.no_grad():
            want = module(x)
        eps = getattr(module, eps_attr)
        errs = {
            o: rel_err(F.layer_norm(x, (x.shape[-1],), module.weight + o, bias, eps), want)
            for o in (0.0, 1.0)
        }
        offset = min(errs, key=errs.get)
        if errs[offset] > FP32_TOL:
            verdict.reason = (
                f"{name} does not compute F.layer_norm(x, offset + weight, bias, eps) for offset 0 or 1 "
                f"(best max rel diff {errs[offset]:.2g})"
            )
            return verdict
        offsets.add(offset)
    if len(offsets) > 1:
        verdict.reason = f"{name}'s instances disagree on the weight offset ({sorted(offsets)})"
        return verdict
    verdict.spec = {"eps_attr": eps_attr, **({"offset": 1.0} if offsets.pop() else {})}
    return verdict


def is_relu_squared_candidate(cls: type) -> bool:
    """An activation module of transformers' ACT2FN table (ReLUSquaredActivation is "relu2")."""
    return cls.__module__ == "transformers.activations"


def decide_relu_squared(captured: Captured) -> Verdict | None:
    """relu_squared when the activation module computes relu(x) ** 2 on its inputs and on random ones; None for
    another activation (not a candidate of any kernel)."""
    name = captured.cls.__name__
    generator = torch.Generator().manual_seed(0)
    inputs = [
        a[0].float() for a in captured.inputs if a and torch.is_tensor(a[0]) and a[0].is_floating_point()
    ]
    inputs.append(torch.randn(2, 5, 16, generator=generator) * 3)
    with torch.no_grad():
        for instance in captured.instances[:3]:
            if any(rel_err(relu_squared_torch(x), instance(x)) > FP32_TOL for x in inputs):
                return None
    return Verdict("relu_squared", captured.target or name)


def is_clamped_gate_candidate(cls: type, module: nn.Module) -> bool:
    """An experts module with an `_apply_gate` method and float `limit` and `alpha` (GPT-OSS's experts)."""
    return callable(getattr(cls, "_apply_gate", None)) and all(
        isinstance(getattr(module, a, None), float) for a in ("limit", "alpha")
    )


def decide_clamped_gate(captured: Captured) -> Verdict:
    """swiglu_clamped when `_apply_gate` computes GPT-OSS's clamped SwiGLU with the module's limit and alpha,
    on random gate_up values that cross the limit."""
    name = captured.cls.__name__
    verdict = Verdict("swiglu_clamped", captured.target or name)
    generator = torch.Generator().manual_seed(0)
    for instance in captured.instances[:3]:
        gate_up = torch.randn(2, 5, 16, generator=generator) * 2 * instance.limit
        with torch.no_grad():
            err = rel_err(
                swiglu_clamped_torch(gate_up, instance.limit, instance.alpha), instance._apply_gate(gate_up)
            )
        if err > FP32_TOL:
            verdict.reason = (
                f"{name}._apply_gate does not compute the clamped SwiGLU over interleaved gate/up pairs with its "
                f"limit and alpha (max rel diff {err:.2g})"
            )
            return verdict
    return verdict


def is_experts_candidate(cls: type) -> bool:
    """A transformers experts module: ``use_experts_implementation`` wrapped its forward and gave it a gate."""
    return callable(getattr(cls, "_apply_gate", None)) and hasattr(cls.forward, "__wrapped__")


def _routing_inputs(instance: nn.Module, captured: Captured, generator: torch.Generator) -> tuple:
    """A forward pass's (hidden_states, top_k_index, top_k_weights), else random routing over every expert."""
    if captured.inputs and len(captured.inputs[0]) >= 3:
        return captured.inputs[0][:3]
    n_experts, hidden = instance.gate_up_proj.shape[0], instance.down_proj.shape[1]
    if getattr(instance, "is_transposed", False):
        hidden = instance.down_proj.shape[2]
    weights, index = torch.rand(6, n_experts, generator=generator).softmax(-1).topk(min(2, n_experts), -1)
    return torch.randn(6, hidden, generator=generator), index, weights


def _experts_gate_error(instance: nn.Module, inputs: tuple, gate: str) -> float:
    from liger_registry.modules.moe import experts_forward

    with torch.no_grad():
        try:
            got = experts_forward(instance, *inputs, gate)
        except (TypeError, ValueError, NotImplementedError, AttributeError):
            return float("inf")
        return rel_err(got, instance(*inputs))


def decide_moe_experts(captured: Captured, config: Any) -> Verdict:
    """moe_experts when the grouped-GEMM forward reproduces the experts module's own forward (fp32, the pass's
    routing) with one of the gates; the gate and the config attribute naming its activation go into the spec."""
    from liger_registry.modules.moe import OWN_GATES, transformers_default_gate
    from liger_registry.schemas.kernels import MOE_GATES

    name = captured.cls.__name__
    # a class with its own _apply_gate computes one of the own gates (the tiny model's values may not reach
    # its clamp, where an unclamped gate would match too); else transformers' default split gate
    own = getattr(captured.cls, "_apply_gate", None) is not transformers_default_gate()
    gates = [g for g in MOE_GATES if (g in OWN_GATES) == own]
    verdict = Verdict("moe_experts", captured.target or name)
    generator = torch.Generator().manual_seed(0)
    instances = captured.instances[:3]
    errors = {}
    for gate in gates:
        errors[gate] = max(
            _experts_gate_error(m, _routing_inputs(m, captured, generator), gate) for m in instances
        )
        if errors[gate] <= FP32_TOL:
            break
    else:
        shown = ", ".join(f"{g} {e:.2g}" for g, e in errors.items())
        verdict.reason = f"the grouped-GEMM experts do not reproduce {name}.forward with any gate ({shown})"
        return verdict
    if gate == "clamped_swiglu":
        verdict.spec = {"gate": gate, "act_config_attr": None}
        return verdict
    attr = next((a for a in ACT_CONFIG_ATTRS if getattr(config, a, None) in MOE_GATES[gate]), None)
    verdict.spec = {"gate": gate} if attr == "hidden_act" else {"gate": gate, "act_config_attr": attr}
    if gate == "swiglu":
        verdict.spec.pop("gate")
    return verdict


def _is_routed_block(cls: type, module: nn.Module) -> bool:
    """A MoE block called with the hidden states alone whose router module says how many experts it selects."""
    router = getattr(module, "router", None)
    return (
        len(tuple(inspect.signature(cls.forward).parameters)[1:]) == 1
        and isinstance(router, nn.Module)
        and isinstance(getattr(router, "top_k", None), int)
    )


def is_input_scaled_block_candidate(cls: type, module: nn.Module) -> bool:
    """A MoE block that runs its experts on router-scaled inputs itself (Llama4TextMoe): forward(hidden_states), a
    router, an experts submodule holding stacked 3-D gate_up_proj / down_proj weights and an act_fn, a shared
    expert and the router's top_k."""
    experts = getattr(module, "experts", None)
    return (
        _is_routed_block(cls, module)
        and all(isinstance(getattr(module, a, None), nn.Module) for a in ("experts", "shared_expert"))
        and all(
            getattr(getattr(experts, w, None), "dim", lambda: 0)() == 3 for w in ("gate_up_proj", "down_proj")
        )
        and isinstance(getattr(experts, "act_fn", None), nn.Module)
    )


def _block_error(block: nn.Module, x: torch.Tensor, gate: str, transposed: bool) -> float:
    from liger_registry.modules.moe import input_scaled_forward

    options = {"weights_of": "experts", "act_fn": "act_fn", "transposed": transposed}
    with torch.no_grad():
        try:
            got, _ = input_scaled_forward(block, x, gate, "gate_up_proj", "down_proj", **options)
        except (TypeError, ValueError, NotImplementedError, AttributeError, RuntimeError):
            return float("inf")
        return rel_err(got, block(x)[0])


def decide_input_scaled_block(captured: Captured, config: Any) -> Verdict:
    """moe_experts with routing input_scaled when running only the selected experts on the scaled inputs
    reproduces the block's own forward (fp32, the pass's hidden states) with a split gate and either weight
    layout."""
    from liger_registry.schemas.kernels import MOE_GATES

    name = captured.cls.__name__
    verdict = Verdict("moe_experts", captured.target or name)
    hidden = captured.instances[0].experts.down_proj.shape[-1]
    x = _input(captured, 0, hidden)
    tried = {}
    for gate in ("swiglu", "geglu"):
        for transposed in (False, True):
            tried[gate, transposed] = max(
                _block_error(m, x, gate, transposed) for m in captured.instances[:3]
            )
            if tried[gate, transposed] <= FP32_TOL:
                spec = {"routing": "input_scaled", "weights_of": "experts", "act_fn": "act_fn"}
                spec |= {"transposed": True} if transposed else {}
                attr = next(
                    (a for a in ACT_CONFIG_ATTRS if getattr(config, a, None) in MOE_GATES[gate]), None
                )
                spec |= {} if gate == "swiglu" else {"gate": gate}
                spec |= {} if attr == "hidden_act" else {"act_config_attr": attr}
                verdict.spec = spec
                return verdict
    shown = ", ".join(f"{g}{' transposed' if t else ''} {e:.2g}" for (g, t), e in tried.items())
    verdict.reason = f"the selected experts on scaled inputs do not reproduce {name}.forward ({shown})"
    return verdict


def stacked_weight_paths(block: nn.Module) -> tuple[str, str] | None:
    """A block's two stacked 3-D expert weights as dotted paths from it, gate/up ([E, 2I, H]) first, then down
    ([E, H, I]) (JetMoeMoE's input_linear.weight and output_linear.weight); None unless there are exactly two
    that fit."""
    found = [(n, p) for n, p in block.named_parameters() if p.dim() == 3]
    if len(found) != 2:
        return None
    for (g, wg), (d, wd) in (found, found[::-1]):
        if wg.shape[0] == wd.shape[0] and wg.shape[1] == 2 * wd.shape[2] and wg.shape[2] == wd.shape[1]:
            return g, d
    return None


def _block_act(block: nn.Module, gate: str) -> str | None:
    """The name of the block's own activation module computing ``gate``'s activation (JetMoeMoE's activation)."""
    from liger_registry.modules.moe import act_classes

    return next((n for n, m in block.named_children() if isinstance(m, act_classes(gate))), None)


def is_softmax_top_k_block_candidate(cls: type, module: nn.Module) -> bool:
    """A MoE block with its router inside, called with the hidden states alone, holding two stacked 3-D expert
    weights and its activation module (JetMoeMoE), and no experts/shared-expert split (see input_scaled)."""
    return (
        _is_routed_block(cls, module)
        and not is_input_scaled_block_candidate(cls, module)
        and stacked_weight_paths(module) is not None
        and any(_block_act(module, gate) for gate in ("swiglu", "geglu"))
    )


def decide_softmax_top_k_block(captured: Captured, config: Any) -> Verdict:
    """moe_experts with routing softmax_top_k when the experts on the kernel, routed by the softmax over the
    router's top_k logits, reproduce the block's own forward (fp32, the pass's hidden states)."""
    from liger_registry.modules.moe import softmax_top_k_forward
    from liger_registry.schemas.kernels import MOE_GATES

    name = captured.cls.__name__
    verdict = Verdict("moe_experts", captured.target or name)
    block = captured.instances[0]
    gate_up, down = stacked_weight_paths(block)
    x = _input(captured, 0, block.get_parameter(down).shape[1])
    errors = {}
    for gate in ("swiglu", "geglu"):
        if (act := _block_act(block, gate)) is None:
            continue
        with torch.no_grad():
            got = softmax_top_k_forward(block, x, gate, gate_up, down, act_fn=act)
            errors[gate] = rel_err(got, block(x))
        if errors[gate] <= FP32_TOL:
            attr = next((a for a in ACT_CONFIG_ATTRS if getattr(config, a, None) in MOE_GATES[gate]), None)
            verdict.spec = {"routing": "softmax_top_k", "gate_up": gate_up, "down": down, "act_fn": act}
            verdict.spec |= {} if gate == "swiglu" else {"gate": gate}
            verdict.spec |= {} if attr == "hidden_act" else {"act_config_attr": attr}
            return verdict
    shown = ", ".join(f"{g} {e:.2g}" for g, e in errors.items())
    verdict.reason = (
        f"the experts routed by the softmax of the top-k logits do not reproduce {name}.forward ({shown})"
    )
    return verdict


def _weights_holder(module: nn.Module) -> tuple[str, nn.Module] | None:
    """The one child holding the experts' weights (two or three floating 2-D / 3-D parameters of its own) and an
    activation module (DbrxExperts' mlp)."""
    holders = [
        (n, c)
        for n, c in module.named_children()
        if len([p for p in c.parameters(recurse=False) if p.dim() in (2, 3) and p.is_floating_point()])
        in (2, 3)
        and any(_block_act(c, gate) for gate in ("swiglu", "geglu"))
    ]
    return holders[0] if len(holders) == 1 else None


def is_described_experts_candidate(cls: type, module: nn.Module) -> bool:
    """An experts class that is not a transformers experts module but takes the routed arguments and keeps its
    weights in one child with its activation (DbrxExperts)."""
    from liger_registry.modules.moe import ROUTED_ARGS

    return (
        not is_experts_candidate(cls)
        and tuple(inspect.signature(cls.forward).parameters)[1:] == ROUTED_ARGS
        and isinstance(getattr(module, "num_experts", None), int)
        and _weights_holder(module) is not None
    )


def _layouts(names: list[str]):
    """(gate_up, up, down) assignments of a holder's weight names: two, a fused gate/up and the down; three, a
    separate gate, up and down."""
    if len(names) == 2:
        return [(g, None, d) for g, d in itertools.permutations(names)]
    return list(itertools.permutations(names))


def _described_error(module: nn.Module, inputs: tuple, options: dict) -> float:
    from liger_registry.modules.moe import experts_forward

    with torch.no_grad():
        try:
            got = experts_forward(module, *inputs, **options)
        except (TypeError, ValueError, NotImplementedError, AttributeError, RuntimeError):
            return float("inf")
        want = module(*inputs)
        return rel_err(got, want) if got.shape == want.shape else float("inf")


def decide_described_experts(captured: Captured, config: Any) -> Verdict:
    """moe_experts for an experts class the spec describes (DbrxExperts): the weights' child, which weight is the
    gate(/up), the up and the down, how the down is stored and the output's shape, found by running every
    assignment against the module's own forward (fp32, the pass's routing) until one reproduces it."""
    from liger_registry.schemas.kernels import MOE_GATES

    name = captured.cls.__name__
    verdict = Verdict("moe_experts", captured.target or name)
    if not captured.inputs or len(captured.inputs[0]) < 3:
        verdict.reason = (
            f"the forward pass did not call {name} with its routing: nothing to prove a layout on"
        )
        return verdict
    module = captured.instances[0]
    holder_name, holder = _weights_holder(module)
    weights = [n for n, p in holder.named_parameters(recurse=False) if p.dim() in (2, 3)]
    x, index, weights_in = captured.inputs[0][:3]
    # the pass's [batch, seq, hidden] and its flattened rows: a forward whose output shape follows the batch (DBRX's
    # view(batch, -1, hidden)) and one that keeps the input's shape agree on the first only
    inputs = [(x, index, weights_in), (x.reshape(-1, x.shape[-1]), index, weights_in)]
    for gate in ("swiglu", "geglu"):
        if (act := _block_act(holder, gate)) is None:
            continue
        for (gate_up, up, down), layout, output in itertools.product(
            _layouts(weights), ("out_in", "in_out"), ("input_shape", "batch_first")
        ):
            options = {"gate": gate, "gate_up": gate_up, "up": up, "down": down, "down_layout": layout}
            options |= {"weights_of": holder_name, "act_fn": act, "output": output}
            if max(_described_error(module, i, options) for i in inputs) <= FP32_TOL:
                spec = {k: v for k, v in options.items() if v is not None}
                spec = {k: v for k, v in spec.items() if (k, v) not in _DESCRIBED_DEFAULTS}
                attr = next(
                    (a for a in ACT_CONFIG_ATTRS if getattr(config, a, None) in MOE_GATES[gate]), None
                )
                spec |= {} if attr == "hidden_act" else {"act_config_attr": attr}
                verdict.spec = spec
                return verdict
    verdict.reason = f"no layout of {name}.{holder_name}'s weights reproduces {name}.forward"
    return verdict


# the spec's defaults a draft leaves out
_DESCRIBED_DEFAULTS = {("gate", "swiglu"), ("down_layout", "out_in"), ("output", "input_shape")}


def glu_projections(module: nn.Module) -> tuple[str, str, str] | None:
    for names in GLU_PROJECTIONS:
        if all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
            return names
    return None


def is_gated_mlp_candidate(cls: type, module: nn.Module) -> bool:
    """An MLP-like module with separate gate/up/down linears or a fused gate_up projection."""
    fused = any(isinstance(getattr(module, n, None), nn.Linear) for n in FUSED_GLU)
    return glu_projections(module) is not None or (fused and "MLP" in cls.__name__)


def fused_glu_projections(module: nn.Module) -> tuple[str, str] | None:
    """(gate_up, down): one fused gate-and-up linear and the down linear."""
    gate_up = next((n for n in FUSED_GLU if isinstance(getattr(module, n, None), nn.Linear)), None)
    down = next(
        (n for n in ("down_proj", "down", "w2") if isinstance(getattr(module, n, None), nn.Linear)), None
    )
    return (gate_up, down) if gate_up is not None and down is not None else None


def _numeric_attr(module: nn.Module, names: tuple[str, ...]) -> str | None:
    """The first of `names` that the module holds as a number."""
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return name
    return None


def _glu_sparsity(module: nn.Module) -> str | None:
    """The module's activation-sparsity attribute, when it also has the top-k method gate_sparsity calls."""
    if not callable(getattr(module, SPARSITY_METHOD, None)):
        return None
    return _numeric_attr(module, GLU_SPARSITIES)


def _glu_errors(
    module: nn.Module, x: torch.Tensor, names: tuple[str, ...]
) -> dict[tuple[str, tuple[str, str] | None], float]:
    """Max rel diff of each gated kernel's formula from the module's output, keyed (kernel, option): option None
    or a GluSpec option and its attribute, ("limit", attr) or ("gate_sparsity", attr); names: (gate, up, down),
    or (gate_up, down) split by chunk(2) with the gate first, as glu_fused splits it. A module with a limit
    attribute runs with the limit lowered to the gate's median magnitude, so only a formula that clamps where the
    module does matches it. A module with a sparsity attribute and its top-k is tried with the top-k first (at
    sparsity 0 both formulas are the same, and the tie keeps the option, which the module's class needs)."""
    with torch.no_grad():
        if len(names) == 2:
            want = module(x)
            gate_up, down = (getattr(module, n) for n in names)
            return {(k, None): rel_err(down(glu_fused_torch(gate_up(x), k)), want) for k in GLU_KINDS}
        gate, up, down = (getattr(module, n) for n in names)
        g, u = gate(x), up(x)
        fns = {"swiglu": swiglu_torch, "geglu": geglu_torch}
        if (attr := _glu_sparsity(module)) is not None:
            want = module(x)
            topk = getattr(module, SPARSITY_METHOD)(g) if getattr(module, attr) > 0 else g
            errs = {(k, ("gate_sparsity", attr)): rel_err(down(f(topk, u)), want) for k, f in fns.items()}
            return errs | {(k, None): rel_err(down(f(g, u)), want) for k, f in fns.items()}
        if (attr := _numeric_attr(module, GLU_LIMITS)) is None:
            want = module(x)
            return {(k, None): rel_err(down(f(g, u)), want) for k, f in fns.items()}
        module = copy.copy(module)  # the lowered limit on a shallow copy: the captured instance keeps its own
        limit = float(g.abs().median())
        setattr(module, attr, limit)
        want = module(x)
        clamped = (g.clamp(max=limit), u.clamp(min=-limit, max=limit))
        errs = {(k, None): rel_err(down(f(g, u)), want) for k, f in fns.items()}
        errs.update({(k, ("limit", attr)): rel_err(down(f(*clamped)), want) for k, f in fns.items()})
        return errs


def _glu_formula(names: tuple[str, ...]) -> str:
    if len(names) == 2:
        return f"{names[1]}(act(gate) * up) with gate, up = {names[0]}(x).chunk(2)"
    gate, up, down = names
    return f"{down}(act({gate}(x)) * {up}(x))"


def decide_glu(captured: Captured, config: Any) -> Verdict:
    """swiglu or geglu: down(act(gate(x)) * up(x)), or over one fused gate_up projection split gate-first,
    against the module's own output in fp32."""
    name, first = captured.cls.__name__, captured.instances[0]
    verdict = Verdict("swiglu", captured.target or name)
    names = glu_projections(first) or fused_glu_projections(first)
    if names is None:
        verdict.reason = f"{name} has a fused gate_up projection but no down projection the kernel can name"
        return verdict
    found: set[tuple[str, tuple[str, str] | None]] = set()
    for index, instance in enumerate(captured.instances[:3]):
        module = _with_random_weight(instance, index).eval()
        x = _input(captured, index, getattr(module, names[0]).in_features)
        errs = _glu_errors(module, x, names)
        best = min(errs, key=errs.get)
        if errs[best] > FP32_TOL:
            verdict.reason = (
                f"{name} does not compute {_glu_formula(names)} with silu or gelu_tanh "
                f"(best max rel diff {errs[best]:.2g}: another activation, another split, or multipliers)"
            )
            return verdict
        found.add(best)
    if len(found) > 1:
        verdict.reason = f"{name}'s instances use different activations or clamps"
        return verdict
    verdict.kernel, option = found.pop()
    act_attr = next((a for a in ACT_CONFIG_ATTRS if getattr(config, a, None)), None)
    # No activation in the config: the class hard-codes it, and the numbers above said which.
    if act_attr is not None and getattr(config, act_attr) not in KINDS[verdict.kernel].activations:
        act = getattr(config, act_attr, None) if act_attr else None
        verdict.reason = (
            f"{name} computes {verdict.kernel} but the config's activation ({act_attr}={act!r}) is not one the "
            f"applier accepts for it ({', '.join(KINDS[verdict.kernel].activations)})"
        )
        return verdict
    roles = ("gate_up", "down") if len(names) == 2 else ("gate", "up", "down")
    spec = dict(zip(roles, names, strict=True))
    verdict.spec = {k: v for k, v in spec.items() if k == "gate_up" or v != f"{k}_proj"}
    if option is not None:
        verdict.spec[option[0]] = option[1]
    if act_attr != "hidden_act":
        # None: the config names no activation (Lfm2MoeMLP hard-codes silu); the numbers above said which
        verdict.spec["act_config_attr"] = act_attr
    return verdict


def rope_dropin(layout: str):
    """The drop-in function the rope kind installs for `layout`."""
    from liger_registry.modules import wiring

    return wiring.maker("rope", RopeSpec(layout=layout).variant)


def _low(value: Any) -> Any:
    return value.to(torch.bfloat16) if torch.is_tensor(value) and value.is_floating_point() else value


def _layout_error(
    layout: str,
    original: Any,
    calls: list[tuple[tuple, dict]],
    low_calls: list[tuple[tuple, dict]] | None = None,
) -> str | None:
    """Why the layout's drop-in does not reproduce the calls (values in fp32), or None. Result dtypes are
    compared on ``low_calls`` (recorded from the model in bf16: q/k in bf16, cos/sin in whatever dtype the
    family's rotary embedding gives them), else on the fp32 calls with every float argument lowered to bf16."""
    dropin = rope_dropin(layout)
    for args, kwargs in calls:
        try:
            got, want = dropin(*args, **kwargs), original(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError) as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        err = max(rel_err(g, w) for g, w in zip(got, want, strict=True))
        if err > FP32_TOL:
            return f"max rel diff {err:.2g}"
    if low_calls is None:
        low_calls = [
            (tuple(_low(a) for a in args), {k: _low(v) for k, v in kw.items()}) for args, kw in calls
        ]
    for args, kwargs in low_calls:
        got_dtypes = [t.dtype for t in dropin(*args, **kwargs)]
        want_dtypes = [t.dtype for t in original(*args, **kwargs)]
        if got_dtypes != want_dtypes:
            return f"bf16 results in {got_dtypes}, the function's in {want_dtypes}"
    return None


def _per_channel_interleaved(args: tuple, kwargs: dict, want: torch.Tensor) -> bool:
    """Interleaved pairs rotated by cos/sin given per channel (Cohere's repeat_interleave'd frequencies)."""
    q, cos, sin = args[0], args[2] if len(args) > 2 else kwargs.get("cos"), args[3] if len(args) > 3 else None
    if (
        not (torch.is_tensor(q) and torch.is_tensor(cos) and torch.is_tensor(sin))
        or cos.shape[-1] != q.shape[-1]
    ):
        return False
    c, s = cos.unsqueeze(kwargs.get("unsqueeze_dim", 1)), sin.unsqueeze(kwargs.get("unsqueeze_dim", 1))
    rotated = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)
    return rel_err(q * c + rotated * s, want) <= FP32_TOL


def _no_layout_reason(
    function: str, original: Any, errors: dict[str, str], calls: list[tuple[tuple, dict]]
) -> str:
    args, kwargs = calls[0]
    tried = "; ".join(f"{layout}: {err[:80]}" for layout, err in errors.items())
    try:
        want = original(*args, **kwargs)[0]
    except (TypeError, ValueError, RuntimeError, IndexError):
        want = None
    if want is not None and _per_channel_interleaved(args, kwargs, want):
        return (
            f"{function} rotates interleaved (even/odd) pairs by cos/sin given per channel (cos[2j] for pair j); "
            f"the interleaved layout reads one cos per pair from the first half ({tried})"
        )
    return f"{function}'s calls are reproduced by none of the rope layouts ({tried})"


def decide_rope(
    function: str,
    original: Any,
    calls: list[tuple[tuple, dict]],
    low_calls: list[tuple[tuple, dict]] | None = None,
) -> Verdict:
    """The function's recorded calls replayed through each layout's drop-in: the first layout that gives the
    same q and k (fp32 values; result dtypes on ``low_calls``, the calls of the model in bf16), or why none
    does."""
    verdict = Verdict(
        "rope", function, spec={} if function == "apply_rotary_pos_emb" else {"function": function}
    )
    if not calls:
        verdict.reason = (
            f"{function} is not called in a forward pass: the attention rotates q and k by other code"
        )
        return verdict
    errors = {}
    for layout in ROPE_LAYOUTS:  # in its order: the first whose drop-in reproduces every recorded call
        if (error := _layout_error(layout, original, calls, low_calls)) is None:
            if layout != "rotate_half":
                verdict.spec["layout"] = layout
            return verdict
        errors[layout] = error
    verdict.reason = _no_layout_reason(function, original, errors, calls)
    return verdict


HEAD_ROLES = ("softcap_attr", "logit_scale_attr", "logit_multiplier_attr")


def _transformed(raw: torch.Tensor, config: Any, roles: dict[str, str]) -> torch.Tensor:
    from liger_registry.forwards.head import logit_transform, postprocess_logits

    return postprocess_logits(raw, *logit_transform(config, *(roles.get(r) for r in HEAD_ROLES)))


def decide_logit_roles(
    raw: torch.Tensor, logits: torch.Tensor, config: Any, candidates: list[str]
) -> dict | None:
    """Which config attributes the head divides by, multiplies by or softcaps with, so that the transformed
    raw lm_head output equals the model's logits; None when no combination of at most two does."""
    options: list[dict[str, str]] = [{}]
    options += [{role: name} for name in candidates for role in HEAD_ROLES]
    options += [
        {scale: a, "softcap_attr": b}
        for a in candidates
        for b in candidates
        if a != b
        for scale in ("logit_scale_attr", "logit_multiplier_attr")
    ]
    for roles in options:
        if rel_err(_transformed(raw, config, roles), logits) <= FP32_TOL:
            return roles
    return None
