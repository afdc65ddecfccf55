"""The reference library's `apply_liger_kernel_to_<type>` functions as data: each one's parameters, defaults and
model types, and what each kernel switch patches on that type, in our kernel kinds.

- `SWITCH_KINDS`: a switch's kinds where the type does not say otherwise (`rms_norm` is every RMSNorm, the fused
  residual add + norm included);
- `ENTRY_POINTS` / `BY_MODEL_TYPE`: one row per reference function; `kinds_for(model_type, switch)` reads them.

Used by the compat entry points and by the integrations' `liger_kernel_config` translation, so a switch means one
thing on every route.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

SWIGLU = ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "swiglu", "model")
GEGLU = ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "geglu", "model")
GEGLU_LN = ("rope", "cross_entropy", "fused_linear_cross_entropy", "layer_norm", "rms_norm", "geglu", "model")
SWIGLU_LN = (
    "rope",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "layer_norm",
    "rms_norm",
    "swiglu",
    "model",
)
VISION_LN = ("cross_entropy", "fused_linear_cross_entropy", "rms_norm", "layer_norm", "model")
CE_OFF = frozenset({"cross_entropy"})
ROPE_CE_OFF = frozenset({"rope", "cross_entropy"})

# What each of the reference's switches patches, as our kernel kinds (each one an `apply` override). A row's `kinds`
# replaces a switch's kinds for that type where its reference function patches something else with it.
SWITCH_KINDS: dict[str, tuple[str, ...]] = {
    "rope": ("rope",),
    # the post-attention RMSNorm is computed by add_rms_norm where the family fuses it with the residual add
    "rms_norm": ("rms_norm", "add_rms_norm"),
    "swiglu": ("swiglu",),
    "geglu": ("geglu",),
    "layer_norm": ("layer_norm",),
    "relu_squared": ("relu_squared",),
    "cross_entropy": ("cross_entropy",),
    "fused_linear_cross_entropy": ("fused_linear_cross_entropy",),
}
# The reference's swiglu swaps the routed experts for its fused experts too, besides the dense/shared MLPs.
EXPERTS = (("swiglu", ("swiglu", "moe_experts")),)
# The reference accepts swiglu and patches nothing with it: the experts' SwiGLU is clamped (GPT-OSS, DeepSeek-V4).
NO_SWIGLU = (("swiglu", ()),)


@dataclass(frozen=True)
class EntryPoint:
    """One `apply_liger_kernel_to_<name>` of the reference library.

    `params`: its parameters in order (`model` included, default None); a switch defaults to True unless it is
    in `off`. `model_types`: the `config.model_type` values the reference maps to it (default: `name` alone).
    `forwards_kwargs`: it takes `**kwargs` (kernel switches it hands on to the language model's function).
    `kinds`: (switch, our kinds) where the function's switch patches other things than SWITCH_KINDS says.
    """

    name: str
    params: tuple[str, ...] = SWIGLU
    off: frozenset[str] = CE_OFF
    model_types: tuple[str, ...] = ()
    forwards_kwargs: bool = False
    kinds: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def kinds_of(self, switch: str) -> tuple[str, ...]:
        """Our kernel kinds the reference's `switch` patches on this type."""
        return dict(self.kinds).get(switch, SWITCH_KINDS.get(switch, (switch,)))

    @property
    def function_name(self) -> str:
        return f"apply_liger_kernel_to_{self.name}"

    @property
    def types(self) -> tuple[str, ...]:
        return self.model_types or (self.name,)

    @property
    def switches(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p != "model")

    def default(self, param: str) -> bool | None:
        return None if param == "model" else param not in self.off

    def signature(self) -> inspect.Signature:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [
            inspect.Parameter(p, kind, default=self.default(p), annotation="PreTrainedModel | None")
            if p == "model"
            else inspect.Parameter(p, kind, default=self.default(p), annotation=bool)
            for p in self.params
        ]
        if self.forwards_kwargs:
            params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
        return inspect.Signature(params, return_annotation="PatchHandle")


# liger-kernel 0.8.5, transformers/monkey_patch.py, in its order.
ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint("granite", off=frozenset({"fused_linear_cross_entropy"})),
    EntryPoint("llama"),
    EntryPoint("smollm3"),
    EntryPoint("llava", ("cross_entropy", "fused_linear_cross_entropy", "model"), forwards_kwargs=True),
    EntryPoint(
        "llama4",
        ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "swiglu", "model", "layer_norm"),
        model_types=("llama4_text", "llama4"),
    ),
    EntryPoint("mllama", SWIGLU_LN, model_types=("mllama", "mllama_text_model")),
    EntryPoint("ministral"),
    EntryPoint("mistral"),
    EntryPoint(
        "nemotron",
        ("relu_squared", "cross_entropy", "fused_linear_cross_entropy", "model"),
        forwards_kwargs=True,
    ),
    EntryPoint("mixtral", kinds=EXPERTS),
    EntryPoint("muse_glimmer", SWIGLU_LN),
    EntryPoint("pixtral", ("rope", "rms_norm", "swiglu", "model"), off=frozenset()),
    EntryPoint("gemma", GEGLU),
    EntryPoint("gemma2", GEGLU),
    EntryPoint("gemma3_text", GEGLU),
    EntryPoint("gemma3", GEGLU_LN),
    EntryPoint("gemma4_text", GEGLU, off=ROPE_CE_OFF),
    EntryPoint("gemma4", GEGLU_LN, off=ROPE_CE_OFF | {"layer_norm"}),
    EntryPoint("paligemma", GEGLU_LN),
    EntryPoint("qwen2"),
    EntryPoint("qwen3"),
    EntryPoint("qwen3_moe", kinds=EXPERTS),
    EntryPoint("gpt_oss", off=CE_OFF | {"swiglu"}, kinds=NO_SWIGLU),
    EntryPoint(
        "qwen2_vl",
        ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "layer_norm", "swiglu", "model"),
        model_types=("qwen2_vl", "qwen2_vl_text"),
    ),
    EntryPoint("qwen2_5_vl", model_types=("qwen2_5_vl", "qwen2_5_vl_text")),
    EntryPoint("qwen3_vl", off=CE_OFF | {"swiglu"}, model_types=("qwen3_vl", "qwen3_vl_text")),
    EntryPoint("qwen3_vl_moe", model_types=("qwen3_vl_moe", "qwen3_vl_moe_text"), kinds=EXPERTS),
    EntryPoint("phi3"),
    EntryPoint("olmo2"),
    EntryPoint("olmo3"),
    EntryPoint("glm4", off=ROPE_CE_OFF),
    EntryPoint("glm4v", off=ROPE_CE_OFF),
    EntryPoint("glm4v_moe", off=ROPE_CE_OFF, kinds=EXPERTS),
    EntryPoint("internvl", VISION_LN, forwards_kwargs=True),
    EntryPoint("smolvlm", VISION_LN, forwards_kwargs=True),
    EntryPoint("falcon_h1"),
    EntryPoint("qwen3_next", off=ROPE_CE_OFF, kinds=EXPERTS),
    EntryPoint("qwen3_5", off=ROPE_CE_OFF, model_types=("qwen3_5", "qwen3_5_text")),
    EntryPoint(
        "qwen3_5_moe", off=ROPE_CE_OFF, model_types=("qwen3_5_moe", "qwen3_5_moe_text"), kinds=EXPERTS
    ),
    EntryPoint("hunyuan_v1_dense"),
    EntryPoint("hunyuan_v1_moe", kinds=EXPERTS),
    EntryPoint("deepseek_v2", off=ROPE_CE_OFF, kinds=EXPERTS),
    EntryPoint("deepseek_v3", off=ROPE_CE_OFF, kinds=EXPERTS),
    EntryPoint("deepseek_v4", off=ROPE_CE_OFF | {"swiglu"}, kinds=NO_SWIGLU),
    EntryPoint("exaone4"),
)

BY_MODEL_TYPE: dict[str, EntryPoint] = {t: e for e in ENTRY_POINTS for t in e.types}
# Every kernel switch any of the functions takes: what `apply_liger_kernel_to` and the **kwargs functions accept.
SWITCHES: tuple[str, ...] = tuple(dict.fromkeys(s for e in ENTRY_POINTS for s in e.switches))


def kinds_for(model_type: str, switch: str) -> tuple[str, ...]:
    """Our kernel kinds the reference's `switch` patches on `model_type` (SWITCH_KINDS for a type it lacks)."""
    entry = BY_MODEL_TYPE.get(model_type)
    return entry.kinds_of(switch) if entry else SWITCH_KINDS.get(switch, (switch,))
