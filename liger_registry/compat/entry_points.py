"""The reference library's `apply_liger_kernel_to_<type>` functions, one table row each, over `liger_registry.apply`.

Each generated function has the reference's signature (parameter names, order, documented defaults), so tools
that read it (`inspect.signature`, kwargs filters) see what they expect. What it does differs on purpose:

- an argument passed turns, as `apply` overrides, our kernels that do what the reference's switch patches for that
  type (`SWITCH_KINDS`, a row's `kinds`): `rope=False` -> `apply(..., rope=False)`, `rms_norm=False` also turns off
  the fused add + norm, qwen3_moe's `swiglu` is our `moe_experts`; a switch that maps to nothing the family has is
  a logged WARNING naming it, never an error (the reference accepts it). An argument left out keeps the family
  entry's choice, which may differ from the reference's default (see the README);
- `model=None` patches the classes of the function's own model type (`apply("<type>")`), as the reference does;
  a model patches that instance only, and must be of a model type the function serves;
- a keyword that is no kernel switch raises; the handle of the patch is returned (revert with it).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import liger_registry
from liger_registry.registry.family_switches import lacks, switch_on_problem

logger = logging.getLogger(__name__)

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


def _unexpected(function: str, names: list[str], allowed: tuple[str, ...]) -> TypeError:
    return TypeError(
        f"{function}() got unexpected keyword argument(s) {', '.join(map(repr, names))}; "
        f"the kernel switches it takes: {', '.join(allowed)}"
    )


def check_switches(function: str, switches: dict[str, Any], allowed: tuple[str, ...] = SWITCHES) -> dict:
    """The kernel switches; a name that is not a switch is a TypeError naming them."""
    unknown = [name for name in switches if name not in allowed]
    if unknown:
        raise _unexpected(function, unknown, allowed)
    return dict(switches)


def _nothing_for(entry: EntryPoint | None, family: Any, switch: str) -> str:
    kinds = entry.kinds_of(switch) if entry else SWITCH_KINDS.get(switch, (switch,))
    if not kinds:
        return f"the reference patches nothing with it on {entry.name}"
    return "; ".join(switch_on_problem(family, kind) for kind in kinds)


def to_overrides(function: str, entry: EntryPoint | None, model_type: str, switches: dict[str, Any]) -> dict:
    """`apply` overrides meaning what the reference's switches mean for this type: each switch turns the kinds it
    patches there (EntryPoint.kinds_of) that the family has; one that maps to none of them is a logged WARNING
    naming it (the reference accepts it), never an error."""
    family = liger_registry.load_registry().family_for(model_type).entry
    overrides: dict[str, Any] = {}
    for switch, value in switches.items():
        kinds = entry.kinds_of(switch) if entry else SWITCH_KINDS.get(switch, (switch,))
        ours = [kind for kind in kinds if lacks(family, kind) is None]
        if ours:
            overrides.update(dict.fromkeys(ours, value))
        elif value:
            logger.warning(
                "%s: %s=True installs nothing on family %r: %s",
                function,
                switch,
                family.family,
                _nothing_for(entry, family, switch),
            )
        else:
            logger.info("%s: %s=False: family %r has nothing to switch off", function, switch, family.family)
    return overrides


def _check_model(entry: EntryPoint, model: Any) -> None:
    model_type = liger_registry.model_type_of(model)
    if model_type not in entry.types:
        other = BY_MODEL_TYPE.get(model_type)
        use = other.function_name if other else "liger_registry.compat.apply_liger_kernel_to"
        raise ValueError(
            f"{entry.function_name}(model=...) serves model_type {', '.join(entry.types)}; this model is "
            f"{model_type!r}: use {use}(model=...), or liger_registry.apply(model)"
        )


def run_entry_point(entry: EntryPoint, model: Any, switches: dict[str, Any]):
    """Apply the switches to `model`, or class-wide to the entry's own model type when `model` is None."""
    if model is None:
        return liger_registry.apply(
            entry.name, **to_overrides(entry.function_name, entry, entry.name, switches)
        )
    _check_model(entry, model)
    model_type = liger_registry.model_type_of(model)
    return liger_registry.apply(model, **to_overrides(entry.function_name, entry, model_type, switches))


def make_entry_point(entry: EntryPoint):
    """The `apply_liger_kernel_to_<name>` function of one row: the reference's signature over `apply`."""
    signature = entry.signature()

    def apply_liger_kernel_to_type(*args: Any, **kwargs: Any):
        given = dict(signature.bind(*args, **kwargs).arguments)  # bind: only what the caller passed
        forwarded = given.pop("kwargs", {})
        model = given.pop("model", None)
        switches = {**given, **check_switches(entry.function_name, forwarded)}
        return run_entry_point(entry, model, switches)

    apply_liger_kernel_to_type.__name__ = apply_liger_kernel_to_type.__qualname__ = entry.function_name
    apply_liger_kernel_to_type.__signature__ = signature
    apply_liger_kernel_to_type.__doc__ = (
        f"liger-kernel's {entry.function_name} over liger_registry.apply: each argument passed turns what the "
        "reference's switch patches for this type, one left out keeps the family entry's choice; model=None "
        f"patches model_type {entry.name!r} class-wide. Returns the PatchHandle."
    )
    return apply_liger_kernel_to_type


FUNCTIONS: dict[str, Any] = {e.function_name: make_entry_point(e) for e in ENTRY_POINTS}
MODEL_TYPE_TO_APPLY_LIGER_FN: dict[str, Any] = {
    t: FUNCTIONS[e.function_name] for t, e in BY_MODEL_TYPE.items()
}


def switches_for(
    model_type: str, liger_kwargs: dict[str, Any], function: str = "AutoLigerKernelForCausalLM"
) -> dict:
    """The switches a model type's reference function takes (any switch for a model type the reference does
    not serve), checked: another name is a TypeError, never filtered away (the reference hands it on to
    transformers, which refuses it)."""
    entry = BY_MODEL_TYPE.get(model_type)
    allowed = SWITCHES if entry is None or entry.forwards_kwargs else entry.switches
    return check_switches(function, liger_kwargs, allowed)


def _taken(function: str, model_type: str, switches: dict[str, Any]) -> dict[str, Any]:
    """The switches the type's reference function takes; the reference's generic functions drop the others, and
    so does this, with a logged WARNING naming each (one liger_kernel_config serves every model type)."""
    entry = BY_MODEL_TYPE.get(model_type)
    if entry is None or entry.forwards_kwargs:
        return switches
    for switch in [s for s in switches if s not in entry.switches]:
        logger.warning(
            "%s: %s=%r is not a switch of %s (it takes %s): ignored, as the reference ignores it",
            function,
            switch,
            switches[switch],
            entry.function_name,
            ", ".join(entry.switches),
        )
    return {k: v for k, v in switches.items() if k in entry.switches}


def apply_liger_kernel_to(model_or_model_type: Any, **liger_kwargs: Any):
    """The reference's `_apply_liger_kernel(model_type, **kw)` and `_apply_liger_kernel_to_instance(model, **kw)`
    in one: a model (or a model type, class-wide) and the reference's kernel switches, each meaning what it means
    for the type's reference function. A name that is no switch at all is a TypeError."""
    function = "apply_liger_kernel_to"
    is_type = isinstance(model_or_model_type, str)
    model_type = model_or_model_type if is_type else liger_registry.model_type_of(model_or_model_type)
    switches = _taken(function, model_type, check_switches(function, liger_kwargs))
    overrides = to_overrides(function, BY_MODEL_TYPE.get(model_type), model_type, switches)
    return liger_registry.apply(model_or_model_type, **overrides)


def _apply_liger_kernel(model_type: str, **kwargs: Any):
    """The reference's name for `apply_liger_kernel_to(model_type, **kwargs)` (class-wide)."""
    return apply_liger_kernel_to(model_type, **kwargs)


def _apply_liger_kernel_to_instance(model: Any, **kwargs: Any):
    """The reference's name for `apply_liger_kernel_to(model, **kwargs)`; transformers' Trainer calls it with
    `model=` and the `liger_kernel_config` dict."""
    return apply_liger_kernel_to(model, **kwargs)
