"""Schemas of the per-kernel sections of a family entry (where each kernel goes, with which options)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from liger_registry.schemas.base import StrictModel
from liger_registry.schemas.defaults import default

CastingMode = Literal["llama", "gemma", "none"]


# How a family's rotary function pairs and rotates the channels: the one list of the layouts (each one's drop-in
# registers itself with @makes("rope", variant=layout); rotate_half's is the kind's own). The order is the
# scaffolder's order of trial: rotate_half first, so a full-head rotary keeps the plain kernel that partial would
# also reproduce.
ROPE_LAYOUTS: dict[str, str] = {
    "rotate_half": "HF's rotate_half over the whole head, results in q's and k's dtypes",
    "partial": (
        "rotate_half on the first cos.shape[-1] channels, the rest passed through (phi3, nemotron, qwen3_next, "
        "qwen3_5)"
    ),
    "interleaved": "pairs (2j, 2j+1) on the first cos.shape[-1] channels (glm4)",
    "interleaved_fp32": "the same rotated in fp32, results in q's and k's dtypes (ernie4_5)",
    "interleaved_repeated": (
        "interleaved pairs on the first cos.shape[-1] channels, cos/sin given repeat-interleaved (pair j's value at "
        "2j and 2j+1: glm4v)"
    ),
    "half_split": "GPT-OSS's halves with one cos per pair",
    "complex": "llama4's apply_rotary_emb(xq, xk, freqs_cis)",
    "complex_heads_first": "the same with q and k [batch, heads, seq, head_dim]: deepseek_v2's apply_rotary_emb",
    "deinterleave": (
        "interleaved pairs rotated by cos[..., :R/2] and written as halves, evens then odds: "
        "apply_rotary_pos_emb_interleave of deepseek_v3 and glm4_moe_lite"
    ),
    "one_tensor": "rotate_half of one tensor per call, (x, cos, sin, unsqueeze_dim): gemma4's apply_rotary_pos_emb",
    "one_tensor_trailing": (
        "one tensor per call, interleaved pairs of its trailing 2 * cos.shape[-1] channels ([nope | rope]) rotated "
        "in fp32 by one cos per pair: deepseek_v4's apply_rotary_pos_emb"
    ),
}
RopeLayout = Literal[tuple(ROPE_LAYOUTS)]
# Sections of registry/defaults.yaml the specs read their defaults from.
RMS_NORM, ROPE, GLU, LAYER_NORM, MOE_EXPERTS = (
    f"kernels.{section}." for section in ("rms_norm", "rope", "glu", "layer_norm", "moe_experts")
)
# The gate each experts kernel computes between its two GEMMs, and the config activations it stands for
# (GPT-OSS's clamped SwiGLU hard-codes its activation: nothing to check in the config).
MOE_GATES: dict[str, tuple[str, ...]] = {
    "swiglu": ("silu", "swish"),
    "geglu": ("gelu_pytorch_tanh", "gelu_tanh"),
    "clamped_swiglu": (),
    "limited_swiglu": ("silu", "swish"),
}
# \Z, not $: "$" also matches before a trailing newline, which a `|` block scalar ends with
_TARGET = re.compile(r"^(transformers(\.[A-Za-z_]\w*)+:)?[A-Za-z_]\w*\Z")


def check_targets(targets: list[str]) -> list[str]:
    """A target is a class name in the family's module, or `transformers.<module>:<Class>`."""
    for target in targets:
        if not _TARGET.match(target):
            raise ValueError(
                f"target {target!r} must be a class name or 'transformers.<module>:<Class>' "
                "(only modules under transformers may be named)"
            )
    return targets


class KernelSpec(StrictModel):
    """Fields every kernel section has."""

    enabled: StrictBool = Field(True, description="Install this kernel. False keeps the original code.")
    reason: str | None = Field(
        None, description="Why the kernel is off, or why its tolerance differs; printed by show and explain."
    )

    @property
    def variant(self) -> str:
        """Which of its kind's variants this spec asks for ("" = the kind's own kernel)."""
        return ""


class ModuleKernelSpec(KernelSpec):
    """A kernel that replaces the forward of module classes."""

    targets: list[str] = Field(
        ..., min_length=1, description="Module classes whose forward is replaced (class names in `module`)."
    )

    _check_targets = field_validator("targets")(check_targets)

    def module_attributes(self, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The attributes (values of these spec fields) every target module must have, each as its alternative
        names (a field given a list: the module needs one of them)."""
        values = (getattr(self, f) for f in fields)
        return [(v,) if isinstance(v, str) else tuple(v) for v in values if v is not None]


class RmsNormSpec(ModuleKernelSpec):
    """RMSNorm: y = x / rms(x) * (offset + weight)."""

    casting_mode: CastingMode = Field(
        default(RMS_NORM + "casting_mode"),
        description="llama: normalise in fp32, cast back, then scale; gemma: all in fp32; none: input dtype.",
    )
    offset: StrictFloat | StrictInt = Field(
        default(RMS_NORM + "offset"), description="Added to the weight (Gemma stores weight - 1)."
    )
    eps_attr: str | list[str] = Field(
        default(RMS_NORM + "eps_attr"),
        description="Attribute of the module that holds epsilon; a list: the first of them the module has (for a "
        "name transformers renamed: Llama4TextRMSNorm's `eps` is `variance_epsilon` from 5.25).",
    )
    weight_attr: str = Field(
        default(RMS_NORM + "weight_attr"), description="Attribute of the module that holds the scale."
    )
    weight_optional: StrictBool = Field(
        default(RMS_NORM + "weight_optional"),
        description="A target module without the weight attribute normalises without a scale (y = x / rms(x)): "
        "Gemma4RMSNorm(with_scale=False), DeepseekV4UnweightedRMSNorm. False: every module must hold it.",
    )

    def module_attributes(self, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
        if self.weight_optional:
            fields = tuple(f for f in fields if f != "weight_attr")
        return super().module_attributes(fields)

    @field_validator("eps_attr")
    @classmethod
    def _one_name_at_least(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("eps_attr: an empty list names no attribute")
        return value


class AddRmsNormSpec(RmsNormSpec):
    """Residual add + RMSNorm fused in llama-shaped decoder layers: ``residual + attention output`` and the
    post-attention norm of it in one kernel. The norm options (those of :class:`RmsNormSpec`, of the norm the
    layer holds) must be the family's rms_norm options."""

    casting_mode: Literal["llama", "gemma"] = Field(
        default(RMS_NORM + "casting_mode"),
        description="The post-attention norm's casting, as the family's rms_norm kernel declares it.",
    )


class GluSpec(ModuleKernelSpec):
    """A gated MLP down(act(gate(x)) * up(x)) whose activation the fused kernel computes."""

    gate: str = Field(default(GLU + "gate"), description="Attribute of the MLP holding the gate projection.")
    up: str = Field(default(GLU + "up"), description="Attribute of the MLP holding the up projection.")
    down: str = Field(default(GLU + "down"), description="Attribute of the MLP holding the down projection.")
    gate_up: str | None = Field(
        default(GLU + "gate_up"),
        description="Attribute holding one fused gate-and-up projection split by chunk(2) (gate first), as in "
        "Phi3MLP and Glm4MLP; set, it replaces gate and up, and the kernel reads both halves in place.",
    )
    limit: str | None = Field(
        default(GLU + "limit"),
        description="Attribute of the MLP holding a clamp limit: the gate is clamped above at it and up to "
        "[-limit, limit] before the activation, as DeepseekV4MLP does with config.swiglu_limit (a None value "
        "clamps nothing). Split gate and up only.",
    )
    gate_sparsity: str | None = Field(
        default(GLU + "gate_sparsity"),
        description="Attribute of the MLP holding an activation-sparsity target: where it is above 0, the gate "
        "goes through the MLP's own `_gaussian_topk` before the activation, as Gemma3nTextMLP does with its "
        "activation_sparsity (the top-k is transformers' method, the kernel computes what follows). Split gate "
        "and up only.",
    )
    act_config_attr: str | list[str] | None = Field(
        default(GLU + "act_config_attr"),
        description="Config attribute naming the activation (or alternatives, the first one the config has); "
        "the plan checks it against the kernel's activation, and a config without it is an error. null: the MLP "
        "hard-codes the kernel's activation (no config attribute to check; say so in `reason`).",
    )

    @model_validator(mode="after")
    def _gate_up_replaces_gate_and_up(self):
        if self.gate_up is not None and (self.gate, self.up) != (default(GLU + "gate"), default(GLU + "up")):
            raise ValueError(f"gate_up {self.gate_up!r} replaces gate and up: set one or the other")
        for option in ("limit", "gate_sparsity"):
            if self.gate_up is not None and getattr(self, option) is not None:
                raise ValueError(
                    f"{option} {getattr(self, option)!r} acts on split gate and up projections; gate_up is set"
                )
        return self

    @property
    def variant(self) -> str:
        return "gate_up" if self.gate_up is not None else ""

    def module_attributes(self, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
        if self.gate_up is None:
            return super().module_attributes(fields)
        return [(self.gate_up,), (self.down,)]


class MoeExpertsSpec(ModuleKernelSpec):
    """The experts of a mixture of experts: an experts module with stacked ``gate_up`` [E, 2I, H] and ``down``
    [E, H, I] weights (or their transposes) whose forward ``(hidden_states, top_k_index, top_k_weights)`` the
    grouped-GEMM kernel replaces; parameters, names and state dict unchanged. The router is not touched. A
    transformers experts module (``use_experts_implementation``) gives the gate through its ``_apply_gate``; any
    other (DbrxExperts: separate 2-D gate, up and down weights in a submodule, the down stored [in, out]) names
    its activation module (``act_fn``) and the weights' layout in the options below."""

    gate: Literal[tuple(MOE_GATES)] = Field(
        default(MOE_EXPERTS + "gate"),
        description="The gate between the GEMMs: swiglu / geglu over a [gate | up] split (transformers' default "
        "_apply_gate), clamped_swiglu (GPT-OSS's _apply_gate: interleaved pairs, the module's limit and alpha) or "
        "limited_swiglu (DeepSeek-V4's _apply_gate: the split SwiGLU, gate and up clamped at the module's limit).",
    )
    gate_up: str = Field(
        default(MOE_EXPERTS + "gate_up"),
        description="Attribute (or dotted path: JetMoeMoE's input_linear.weight) holding the gate/up weights "
        "(only the gate's when `up` is set).",
    )
    up: str | None = Field(
        default(MOE_EXPERTS + "up"),
        description="Attribute holding separate up weights, of the gate weights' shape (DbrxExpertGLU's v1 beside "
        "its w1), read in place; null: gate_up holds both halves. Split gates only (not clamped_swiglu).",
    )
    down: str = Field(default(MOE_EXPERTS + "down"), description="Attribute holding the down weights.")
    down_layout: Literal["out_in", "in_out"] = Field(
        default(MOE_EXPERTS + "down_layout"),
        description="How each expert's down matrix is stored beside the gate/up matrices: out_in, as they are "
        "([H, I] when they are [I, H]: transformers' experts, either is_transposed layout); in_out, the other way "
        "round (DbrxExpertGLU's w2, [I, H] and used as h @ w2), passed to the kernel as a transposed view, no copy.",
    )
    weights_of: str | None = Field(
        default(MOE_EXPERTS + "weights_of"),
        description="Submodule of the experts module holding the weights and `act_fn` (DbrxExperts' mlp, a "
        "DbrxExpertGLU); null: the experts module itself.",
    )
    num_experts: str = Field(
        default(MOE_EXPERTS + "num_experts"),
        description="Attribute of the experts module holding the number of experts E: a weight stored 2-D "
        "[E * rows, cols] (DbrxExpertGLU's) is viewed [E, rows, cols] in place by it.",
    )
    act_fn: str | None = Field(
        default(MOE_EXPERTS + "act_fn"),
        description="Attribute (of the weights' module) holding the activation module of act(gate) * up, for an "
        "experts class that is not a transformers experts module (DbrxExpertGLU's activation_fn, built from "
        "config.ffn_config.ffn_act_fn, a dict act_config_attr cannot read): each module's is checked to compute "
        "the gate's activation. swiglu and geglu only.",
    )
    output: Literal["input_shape", "batch_first"] = Field(
        default(MOE_EXPERTS + "output"),
        description="The shape the forward returns: input_shape, the hidden states' (transformers' experts "
        "modules, given [T, H]); batch_first, [hidden_states.shape[0], -1, H] (DbrxExperts.forward, given the "
        "decoder's [B, S, H]).",
    )
    transposed: StrictBool | None = Field(
        default(MOE_EXPERTS + "transposed"),
        description="Whether the weights are stored [in, out] (gate/up [E, H, 2I], down [E, I, H], as "
        "Llama4TextExperts multiplies them: x @ w); null: the experts module's is_transposed flag (transformers' "
        "experts modules), [out, in] without one.",
    )
    routing: Literal["top_k", "input_scaled", "softmax_top_k"] = Field(
        default(MOE_EXPERTS + "routing"),
        description="What the target is. top_k: an experts module called with the router's top-k indices and "
        "weights, each expert's output scaled by its weight (transformers' experts modules, DbrxExperts). "
        "input_scaled: a whole MoE block (Llama4TextMoe: forward(hidden_states) -> (out, router_logits)) whose "
        "`router` gives dense per-expert scores (zero where not selected) and which scales each expert's input by "
        "its score, runs every expert on every token and adds its `shared_expert`: the kernel runs only the "
        "`top_k` selected experts, on the scaled inputs (the others compute act(0) * 0 = 0 there). `weights_of` "
        "names the experts submodule. softmax_top_k: a whole MoE block (JetMoeMoE: forward(layer_input) -> out) "
        "whose `router` returns its logits last and routes each token to its top_k logits, weighted by their "
        "softmax; the block adds its `bias` (when it has one) to the experts' weighted sum. For both, the block's "
        "router is called as unpatched (its outputs recorded), and `router.top_k` is the number selected.",
    )
    act_config_attr: str | list[str] | None = Field(
        default(MOE_EXPERTS + "act_config_attr"),
        description="Config attribute naming the experts' activation, checked against the gate (see GluSpec); "
        "null for clamped_swiglu, whose activation is fixed, and where `act_fn` checks the module instead.",
    )

    @property
    def activations(self) -> tuple[str, ...]:
        """The config activations this spec's gate computes (the plan checks the config against them)."""
        return MOE_GATES[self.gate]

    @model_validator(mode="after")
    def _options_fit_the_gate(self):
        if self.gate == "clamped_swiglu" and self.act_config_attr is not None:
            raise ValueError("gate clamped_swiglu computes a fixed activation: set act_config_attr: null")
        if self.up is not None and self.gate == "clamped_swiglu":
            raise ValueError(
                f"up {self.up!r}: separate up weights feed a [gate | up] gate, not clamped_swiglu"
            )
        if self.routing != "top_k" and self.gate not in ("swiglu", "geglu"):
            raise ValueError(f"routing {self.routing} runs a swiglu or geglu gate, not {self.gate}")
        if self.routing == "input_scaled" and self.weights_of is None:
            raise ValueError("routing input_scaled runs a block's experts submodule: name it in weights_of")
        if self.act_fn is not None and self.gate not in ("swiglu", "geglu"):
            raise ValueError(
                f"act_fn {self.act_fn!r}: act(gate) * up is gate swiglu or geglu, not {self.gate}"
            )
        return self

    def module_attributes(self, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
        if self.weights_of is not None:  # the weights are the submodule's: the kind's check reads them there
            return [(self.weights_of,)]
        return super().module_attributes(fields) + ([(self.up,)] if self.up is not None else [])


class LayerNormSpec(ModuleKernelSpec):
    """LayerNorm: y = (x - mean) / std * (offset + weight) + bias; a module without a bias attribute (or with
    ``bias = None``) adds none, one without a weight attribute scales by none (OlmoLayerNorm)."""

    eps_attr: str = Field(
        default(LAYER_NORM + "eps_attr"), description="Attribute of the module that holds epsilon."
    )
    eps: StrictFloat | None = Field(
        default(LAYER_NORM + "eps"),
        description="Epsilon for a class that hard-codes it in its forward (OlmoLayerNorm: 1e-5); set, it "
        "replaces eps_attr.",
    )
    broadcast_weight: StrictBool = Field(
        default(LAYER_NORM + "broadcast_weight"),
        description="A weight of more than one dim is x's trailing shape, broadcast over the normalised last "
        "dim's rows (CohereLayerNorm's QK norm: [heads, head_dim], each head normalised over head_dim); False: "
        "a weight must be [hidden].",
    )
    offset: Literal[0.0, 1.0] = Field(
        default(LAYER_NORM + "offset"),
        description="1.0: LayerNorm1P (nemotron), weight + 1 formed in the weight's dtype and the inputs cast "
        "as NemotronLayerNorm1P casts them under autocast.",
    )

    @property
    def variant(self) -> str:
        return "1p" if self.offset else ""

    def module_attributes(self, fields: tuple[str, ...]) -> list[tuple[str, ...]]:
        if self.eps is not None:
            fields = tuple(f for f in fields if f != "eps_attr")
        return super().module_attributes(fields)


class RopeSpec(KernelSpec):
    """Rotary embedding: a module-level function, so it can only be patched module-wide."""

    function: str = Field(default(ROPE + "function"), description="Function name in the family's module.")
    layout: RopeLayout = Field(
        default(ROPE + "layout"),
        description="; ".join(f"{name}: {about}" for name, about in ROPE_LAYOUTS.items()) + ".",
    )

    @property
    def variant(self) -> str:
        return "" if self.layout == "rotate_half" else self.layout


class CrossEntropySpec(KernelSpec):
    """Cross entropy on the logits the causal-LM forward materialises (FLCE off, eval, skip_logits=False): the
    forward computes the loss with the cross-entropy kernel instead of transformers' loss, in the patched model
    only. Every family with a causal-LM head has it."""

    enabled: StrictBool = Field(
        default("cross_entropy.enabled"),
        description="Off by default (transformers' loss on the logits; FLCE covers the training loss): the "
        "reference library's cross_entropy switch.",
    )
