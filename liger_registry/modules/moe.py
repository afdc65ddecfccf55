"""MoE experts module forward: an experts module (``forward(hidden_states, top_k_index, top_k_weights)``) on the
grouped-GEMM kernel, its parameters read in place (names, state dict, PEFT and FSDP untouched): a transformers
experts module (``use_experts_implementation``: stacked gate/up and down weights, the gate its ``_apply_gate``),
or one the spec describes (DbrxExperts: separate 2-D gate, up and down weights in its ``mlp``, the down stored
[in, out], the gate an activation module). The router and everything around the experts stay transformers' code,
except for a block whose experts run on inputs scaled by dense router scores (Llama4TextMoe, routing
``input_scaled``) or whose router sits inside the block (JetMoeMoE, ``softmax_top_k``): there the block's forward is
replaced, calling its own router (and shared expert)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch
from torch import nn

from liger_registry.attr_path import read_path
from liger_registry.kernels.moe import moe_experts
from liger_registry.modules.wiring import checks, makes
from liger_registry.schemas import MoeExpertsSpec
from liger_registry.schemas.kernels import MOE_GATES

# the gates that are an experts class's own _apply_gate (with the module's limit), not transformers' default
OWN_GATES = ("clamped_swiglu", "limited_swiglu")
# what an experts class that is not a transformers experts module must take (DbrxExperts does)
ROUTED_ARGS = ("hidden_states", "top_k_index", "top_k_weights")
# the routings whose target is a whole MoE block called with the hidden states alone, router inside
BLOCK_ROUTINGS = ("input_scaled", "softmax_top_k")

_UNSERVED = {
    "has_gate": (False, "ungated experts (act_fn(up) only)"),
    "has_post_expert_norm": (True, "a norm after each expert"),
    "_is_expert_parallel": (True, "expert parallelism (sentinel expert ids)"),
}


def _unserved(module: nn.Module) -> list[str]:
    return [why for attr, (bad, why) in _UNSERVED.items() if getattr(module, attr, not bad) == bad]


def _weight_problem(module: nn.Module, holder: nn.Module, name: str, num_experts: str) -> str | None:
    """Why ``holder.name`` is not an expert weight the kernel reads in place: stacked 3-D, or 2-D [E * rows, cols]
    with E the experts module's ``num_experts``."""
    weight = read_path(holder, name)
    if weight is None:
        return f"{type(holder).__name__} has no expert weight {name!r}"
    floating = isinstance(weight, torch.Tensor) and weight.dtype.is_floating_point
    if not floating or weight.dim() not in (2, 3):
        return (
            f"{type(holder).__name__}.{name} is not a stacked [E, out, in] floating-point weight "
            f"({type(weight).__name__}): quantised experts are not served by moe_experts; turn the kernel off"
        )
    n = getattr(module, num_experts, None)
    if weight.dim() == 2 and (not isinstance(n, int) or n <= 0 or weight.shape[0] % n):
        return (
            f"{type(holder).__name__}.{name} {tuple(weight.shape)} is 2-D: its rows do not split into "
            f"{type(module).__name__}.{num_experts} ({n!r}) experts"
        )
    return None


def _weight(module: nn.Module, holder: nn.Module, name: str, num_experts: str) -> torch.Tensor:
    if problem := _weight_problem(module, holder, name, num_experts):
        raise TypeError(problem)
    weight = read_path(holder, name)
    if weight.dim() == 2:  # every expert's rows in one parameter (DbrxExpertGLU): a view, no copy
        n = getattr(module, num_experts)
        return weight.view(n, weight.shape[0] // n, weight.shape[1])
    return weight


@functools.cache
def act_classes(gate: str) -> tuple[type, ...]:
    """The activation modules transformers builds for the config activations of ``gate``."""
    from transformers.activations import ACT2FN

    return tuple({type(ACT2FN[name]) for name in MOE_GATES[gate] if name in ACT2FN})


def _act_problem(holder: nn.Module, act_fn: str, gate: str) -> str | None:
    act = getattr(holder, act_fn, None)
    if isinstance(act, act_classes(gate)):
        return None
    return (
        f"{type(holder).__name__}.{act_fn} is {type(act).__name__}, not the activation of the {gate} gate "
        f"({', '.join(MOE_GATES[gate])})"
    )


def experts_forward(
    module: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate: str = "swiglu",
    gate_up: str = "gate_up_proj",
    down: str = "down_proj",
    *,
    up: str | None = None,
    down_layout: str = "out_in",
    weights_of: str | None = None,
    num_experts: str = "num_experts",
    act_fn: str | None = None,
    output: str = "input_shape",
    transposed: bool | None = None,
) -> torch.Tensor:
    """What ``module``'s experts forward returns, computed by :func:`~liger_registry.kernels.moe.moe_experts`; the
    keyword options are :class:`~liger_registry.schemas.MoeExpertsSpec`'s."""
    holder = module if weights_of is None else getattr(module, weights_of)
    problems = _unserved(module)
    # the plan checks each module's activation when it patches a model; an eager call checks it again (a class
    # patched without a model), a compiled one does not trace the lookup
    checked = act_fn is None or torch.compiler.is_compiling()
    if not checked and (problem := _act_problem(holder, act_fn, gate)):
        problems.append(problem)
    if problems:
        raise NotImplementedError(
            f"{type(module).__name__}: moe_experts does not serve {', '.join(problems)}; turn the kernel off "
            "(policy kernels.moe_experts.enabled: false) for this run"
        )
    bias = getattr(module, "has_bias", False)
    clamped = gate in OWN_GATES
    w_d = _weight(module, holder, down, num_experts)
    out = moe_experts(
        hidden_states.reshape(-1, hidden_states.shape[-1]),
        top_k_index,
        top_k_weights,
        _weight(module, holder, gate_up, num_experts),
        w_d.transpose(1, 2) if down_layout == "in_out" else w_d,
        getattr(holder, f"{gate_up}_bias") if bias else None,
        getattr(holder, f"{down}_bias") if bias else None,
        act=gate,
        limit=module.limit if clamped else 0.0,
        alpha=module.alpha if gate == "clamped_swiglu" else 0.0,
        transposed=getattr(module, "is_transposed", False) if transposed is None else transposed,
        up_proj=_weight(module, holder, up, num_experts) if up is not None else None,
    )
    if output == "batch_first":  # DbrxExperts.forward's view(batch_size, -1, hidden)
        return out.view(hidden_states.shape[0], -1, out.shape[-1])
    return out.view(hidden_states.shape)


def input_scaled_forward(
    block: nn.Module, hidden_states: torch.Tensor, gate: str, gate_up: str, down: str, **options
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a Llama4TextMoe-like block returns, ``(out, router_logits)``, with only the selected experts run.

    The block's router gives dense scores [T, E] (the sigmoid of the top-k logits, zero elsewhere) and the block
    runs every expert on every token's input scaled by its score: an unselected expert sees zeros and adds
    act(0) * 0 = 0. So each of the ``top_k`` selected (token, expert) pairs becomes one row of scaled input
    (rounded as the block rounds its product), routed to its expert with weight 1, and a token's rows are summed.
    The router is the block's own module (its outputs recorded as unpatched); the selection is its top-k."""
    h = hidden_states.shape[-1]
    x = hidden_states.reshape(-1, h)
    scores, router_logits = block.router(x)
    k = block.router.top_k
    index = router_logits.topk(k, dim=1).indices
    scaled = (x.unsqueeze(1) * scores.gather(1, index).unsqueeze(-1)).reshape(-1, h)
    ones = torch.ones(scaled.shape[0], 1, dtype=scores.dtype, device=scores.device)
    routed = experts_forward(block, scaled, index.reshape(-1, 1), ones, gate, gate_up, down, **options)
    if k > 1:
        routed = routed.view(x.shape[0], k, h).sum(1)
    out = block.shared_expert(x)
    out.add_(routed)
    return out, router_logits


def softmax_top_k_forward(
    block: nn.Module, hidden_states: torch.Tensor, gate: str, gate_up: str, down: str, **options
):
    """What a JetMoeMoE-like block returns: its router's top_k logits softmaxed into the routing weights, the
    experts' weighted sum and the block's ``bias`` (when it has one). The router is the block's own module (its
    logits, its last output, recorded as unpatched); the selection and weights are computed from those logits as
    the router computes them."""
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    router_logits = block.router(x)[-1]
    top, index = router_logits.topk(block.router.top_k, dim=1)
    weights = torch.softmax(top, dim=1).type_as(x)
    out = experts_forward(block, x, index, weights, gate, gate_up, down, **options).view(hidden_states.shape)
    bias = getattr(block, "bias", None)
    return out if bias is None else out + bias


def _options(spec: MoeExpertsSpec) -> dict:
    """The spec's layout options, as :func:`experts_forward` takes them."""
    names = ("up", "down_layout", "weights_of", "num_experts", "act_fn", "output", "transposed")
    return {name: getattr(spec, name) for name in names}


@makes("moe_experts")
def moe_experts_forward(spec: MoeExpertsSpec) -> Callable:
    gate, gate_up, down, options = spec.gate, spec.gate_up, spec.down, _options(spec)
    if spec.routing in BLOCK_ROUTINGS:
        block = input_scaled_forward if spec.routing == "input_scaled" else softmax_top_k_forward

        def block_forward(self, hidden_states):
            return block(self, hidden_states, gate, gate_up, down, **options)

        return block_forward

    # GptOssExperts names the routing arguments router_indices / routing_weights; the others top_k_index /
    # top_k_weights: a caller passing them by keyword reaches the kernel under either name.
    def forward(
        self, hidden_states, top_k_index=None, top_k_weights=None, router_indices=None, routing_weights=None
    ):
        index = top_k_index if top_k_index is not None else router_indices
        weights = top_k_weights if top_k_weights is not None else routing_weights
        if index is None or weights is None:
            raise TypeError(f"{type(self).__name__}.forward: the routing indices and weights are required")
        return experts_forward(self, hidden_states, index, weights, gate, gate_up, down, **options)

    return forward


def transformers_default_gate() -> Callable | None:
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # pragma: no cover - every supported release has it
        return None
    return _default_apply_gate


def is_experts_implementation(cls: type) -> bool:
    """A transformers experts module: ``use_experts_implementation`` wrapped its forward and gave it a gate."""
    return getattr(cls, "_apply_gate", None) is not None and hasattr(cls.forward, "__wrapped__")


def _gate_problem(spec: MoeExpertsSpec, cls: type) -> str | None:
    """A transformers experts class's ``_apply_gate`` must be the spec's gate."""
    apply_gate = cls._apply_gate
    default = transformers_default_gate()
    if spec.gate in OWN_GATES and apply_gate is default:
        return f"{cls.__name__} uses transformers' default gate (act(gate) * up), not {spec.gate}"
    if spec.gate not in OWN_GATES and default is not None and apply_gate is not default:
        return (
            f"{cls.__name__} overrides _apply_gate ({apply_gate.__qualname__}): its gate is not {spec.gate}"
        )
    return None


def _described_problem(spec: MoeExpertsSpec, cls: type) -> str | None:
    """Another experts class is served when the spec names its activation module and it takes the routed
    arguments (DbrxExperts), or, with routing input_scaled, the hidden states alone (Llama4TextMoe)."""
    if spec.act_fn is None:
        return (
            f"{cls.__name__} is not a transformers experts module (use_experts_implementation), and the spec names "
            "no act_fn (its activation module) to serve it by"
        )
    args = tuple(inspect.signature(cls.forward).parameters)[1:]
    if spec.routing in BLOCK_ROUTINGS:
        if len(args) != 1:
            return f"{cls.__name__}.forward takes ({', '.join(args)}), not the hidden states alone"
    elif args != ROUTED_ARGS:
        return f"{cls.__name__}.forward takes ({', '.join(args)}), not ({', '.join(ROUTED_ARGS)})"
    return None


def _block_problem(block: nn.Module, routing: str) -> str | None:
    """What a block must hold besides its experts: its router with the top_k it selects, and (input_scaled) its
    shared expert."""
    cls = type(block).__name__
    wanted = ("router", "shared_expert") if routing == "input_scaled" else ("router",)
    missing = [a for a in wanted if not isinstance(getattr(block, a, None), nn.Module)]
    if missing:
        return f"{cls} has no {' or '.join(missing)} module (routing {routing} runs the block's own)"
    top_k = getattr(block.router, "top_k", None)
    if not isinstance(top_k, int) or top_k <= 0:
        return f"{cls}.router.top_k is {top_k!r}, not the number of experts each token selects"
    return None


def _module_problem(spec: MoeExpertsSpec, module: nn.Module) -> str | None:
    """What one experts module holds that the kernel does not serve: its flags, its weights, its activation."""
    cls = type(module).__name__
    if problems := _unserved(module):
        return f"{cls}: {', '.join(problems)} not served"
    if spec.routing in BLOCK_ROUTINGS and (problem := _block_problem(module, spec.routing)):
        return problem
    holder = module if spec.weights_of is None else getattr(module, spec.weights_of, None)
    if not isinstance(holder, nn.Module):
        return f"{cls}.{spec.weights_of} is not a module holding the expert weights"
    names = [n for n in (spec.gate_up, spec.up, spec.down) if n is not None]
    if problem := next(
        (p for n in names if (p := _weight_problem(module, holder, n, spec.num_experts))), None
    ):
        return problem
    return _act_problem(holder, spec.act_fn, spec.gate) if spec.act_fn is not None else None


@checks("moe_experts")
def moe_experts_problem(spec: MoeExpertsSpec, entry, target, resolve_class) -> str | None:
    """Why the kernel cannot replace this experts class's forward; None when it can: a class transformers'
    ``use_experts_implementation`` wraps, whose ``_apply_gate`` is the gate the spec names (transformers' default
    split gate for swiglu / geglu, the class's own for the OWN_GATES), or another class taking the routed
    arguments whose activation module the spec names (``act_fn``); on a module, its weights and activation too."""
    cls = target if isinstance(target, type) else type(target)
    if is_experts_implementation(cls) and spec.routing == "top_k":
        problem = _gate_problem(spec, cls)
    else:
        problem = _described_problem(spec, cls)
    if problem is None and not isinstance(target, type):
        problem = _module_problem(spec, target)
    return problem
