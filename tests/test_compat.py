"""liger_registry.compat against liger-kernel 0.8.5's documented signatures, recorded here as data from its source
(transformers/monkey_patch.py, functional.py, cross_entropy.py, fused_linear_cross_entropy.py; never imported):
the signatures, the mapping onto apply() read back from the handle, a tiny llama trained through both, and the
loss modules and functional names against torch on fp32 inputs (the PyTorch and the Triton path).

The cross_entropy switch reaches apply() as an override like the others (our CE kernel on the logits), and
switching off a kernel the family lacks is accepted; the return_* flags of LigerCrossEntropyLoss reach
kernels.cross_entropy.
"""

from __future__ import annotations

import copy
import inspect
import logging

import pytest
import torch
import torch.nn.functional as F

import liger_registry
from liger_registry import compat
from liger_registry.schemas import OVERRIDE_PATHS
from liger_registry.testing import tiny_batch, tiny_model

REQUIRED = inspect.Parameter.empty

# apply_liger_kernel_to_<type>: (parameter, documented default) in order; ("**kwargs", None) when it has one.
# fmt: off
DOCUMENTED_APPLY = {
    "granite": (("rope", True), ("cross_entropy", True), ("fused_linear_cross_entropy", False), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "llama": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "smollm3": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "llava": (("cross_entropy", False), ("fused_linear_cross_entropy", True), ("model", None), ("**kwargs", None)),
    "llama4": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None), ("layer_norm", True)),
    "mllama": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("layer_norm", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "ministral": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "mistral": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "nemotron": (("relu_squared", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("model", None), ("**kwargs", None)),
    "mixtral": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "muse_glimmer": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("layer_norm", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "pixtral": (("rope", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "gemma": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("geglu", True), ("model", None)),
    "gemma2": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("geglu", True), ("model", None)),
    "gemma3_text": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("geglu", True), ("model", None)),
    "gemma3": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("layer_norm", True), ("rms_norm", True), ("geglu", True), ("model", None)),
    "gemma4_text": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("geglu", True), ("model", None)),
    "gemma4": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("layer_norm", False), ("rms_norm", True), ("geglu", True), ("model", None)),
    "paligemma": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("layer_norm", True), ("rms_norm", True), ("geglu", True), ("model", None)),
    "qwen2": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "qwen3": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "qwen3_moe": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "gpt_oss": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", False), ("model", None)),
    "qwen2_vl": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("layer_norm", True), ("swiglu", True), ("model", None)),
    "qwen2_5_vl": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "qwen3_vl": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", False), ("model", None)),
    "qwen3_vl_moe": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "phi3": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "olmo2": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "olmo3": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "glm4": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "glm4v": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "glm4v_moe": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "internvl": (("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("layer_norm", True), ("model", None), ("**kwargs", None)),
    "smolvlm": (("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("layer_norm", True), ("model", None), ("**kwargs", None)),
    "falcon_h1": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "qwen3_next": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "qwen3_5": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "qwen3_5_moe": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "hunyuan_v1_dense": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "hunyuan_v1_moe": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "deepseek_v2": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "deepseek_v3": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
    "deepseek_v4": (("rope", False), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", False), ("model", None)),
    "exaone4": (("rope", True), ("cross_entropy", False), ("fused_linear_cross_entropy", True), ("rms_norm", True), ("swiglu", True), ("model", None)),
}

# config.model_type -> the function"s <type> (MODEL_TYPE_TO_APPLY_LIGER_FN).
DOCUMENTED_MODEL_TYPES = {
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v4": "deepseek_v4",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
    "gemma3": "gemma3",
    "gemma4_text": "gemma4_text",
    "gemma4": "gemma4",
    "glm4": "glm4",
    "glm4v": "glm4v",
    "glm4v_moe": "glm4v_moe",
    "gpt_oss": "gpt_oss",
    "internvl": "internvl",
    "llama": "llama",
    "llama4_text": "llama4",
    "llama4": "llama4",
    "llava": "llava",
    "granite": "granite",
    "mllama": "mllama",
    "mllama_text_model": "mllama",
    "ministral": "ministral",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "muse_glimmer": "muse_glimmer",
    "nemotron": "nemotron",
    "olmo2": "olmo2",
    "pixtral": "pixtral",
    "olmo3": "olmo3",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen2_vl": "qwen2_vl",
    "qwen2_vl_text": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen2_5_vl_text": "qwen2_5_vl",
    "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_text": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl_moe",
    "qwen3_vl_moe_text": "qwen3_vl_moe",
    "smollm3": "smollm3",
    "phi3": "phi3",
    "paligemma": "paligemma",
    "falcon_h1": "falcon_h1",
    "smolvlm": "smolvlm",
    "hunyuan_v1_dense": "hunyuan_v1_dense",
    "hunyuan_v1_moe": "hunyuan_v1_moe",
    "exaone4": "exaone4",
}

# The loss modules" and functional names" parameters (self left out).
DOCUMENTED_CALLABLES = {
    "liger_cross_entropy": (("input", REQUIRED), ("target", REQUIRED), ("weight", None), ("size_average", None), ("ignore_index", -100), ("reduce", None), ("reduction", "mean"), ("label_smoothing", 0.0), ("lse_square_scale", 0.0), ("softcap", None), ("return_z_loss", False), ("return_token_accuracy", False), ("return_predicted_tokens", False)),
    "liger_fused_linear_cross_entropy": (("input", REQUIRED), ("weight", REQUIRED), ("target", REQUIRED), ("bias", None), ("ce_weight", None), ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0), ("reduction", "mean"), ("softcap", None), ("return_z_loss", False), ("accum_dtype", None), ("use_token_scaling", False), ("return_token_accuracy", False), ("return_predicted_tokens", False), ("chunk_mem_const", 1)),
    "liger_geglu": (("a", REQUIRED), ("b", REQUIRED)),
    "liger_layer_norm": (("X", REQUIRED), ("W", REQUIRED), ("B", REQUIRED), ("eps", REQUIRED)),
    "liger_swiglu": (("a", REQUIRED), ("b", REQUIRED)),
    "LigerCrossEntropyLoss.__init__": (("weight", None), ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0), ("reduction", "mean"), ("softcap", None), ("return_z_loss", False), ("return_token_accuracy", False), ("return_predicted_tokens", False)),
    "LigerCrossEntropyLoss.forward": (("_input", REQUIRED), ("target", REQUIRED)),
    "LigerFusedLinearCrossEntropyLoss.__init__": (("ce_weight", None), ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0), ("reduction", "mean"), ("softcap", None), ("return_z_loss", False), ("accum_dtype", None), ("use_token_scaling", False), ("return_token_accuracy", False), ("return_predicted_tokens", False)),
    "_apply_liger_kernel": (("model_type", REQUIRED), ("**kwargs", None)),
    "_apply_liger_kernel_to_instance": (("model", REQUIRED), ("**kwargs", None)),
    "LigerFusedLinearCrossEntropyLoss.forward": (("lin_weight", REQUIRED), ("_input", REQUIRED), ("target", REQUIRED), ("bias", None)),
}
# fmt: on


def _params(fn) -> tuple[tuple[str, object], ...]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            out.append(("**kwargs", None))
        elif p.name != "self":
            out.append((p.name, p.default))
    return tuple(out)


# --- signatures ---------------------------------------------------------------------------------------------


def test_every_documented_entry_point_and_no_other():
    ours = {name for name in compat.__all__ if name.startswith("apply_liger_kernel_to_")}
    assert ours == {f"apply_liger_kernel_to_{t}" for t in DOCUMENTED_APPLY}


@pytest.mark.parametrize("name", sorted(DOCUMENTED_APPLY))
def test_entry_point_signature_is_the_documented_one(name):
    fn = getattr(compat, f"apply_liger_kernel_to_{name}")
    assert fn.__name__ == f"apply_liger_kernel_to_{name}"
    assert _params(fn) == DOCUMENTED_APPLY[name]


def test_model_type_table_is_the_documented_one():
    assert {t: fn.__name__ for t, fn in compat.MODEL_TYPE_TO_APPLY_LIGER_FN.items()} == {
        t: f"apply_liger_kernel_to_{name}" for t, name in DOCUMENTED_MODEL_TYPES.items()
    }


@pytest.mark.parametrize("name", sorted(DOCUMENTED_CALLABLES))
def test_loss_and_generic_signature_is_the_documented_one(name):
    owner, _, method = name.partition(".")
    fn = getattr(compat, owner)
    assert _params(getattr(fn, method) if method else fn) == DOCUMENTED_CALLABLES[name]


# --- the mapping onto apply() -----------------------------------------------------------------------------------


@pytest.fixture
def llama():
    model = tiny_model("llama")
    yield model
    liger_registry.revert(model)


def _overrides(handle) -> dict[str, object]:
    """The knobs the handle's configuration took from keyword overrides, by override name."""
    config = handle.report.config
    return {
        name: config.values[path]
        for name, path in OVERRIDE_PATHS.items()
        if path in config.values and str(config.source(path)) == "override"
    }


# llama's rms_norm switch patches every RMSNorm, the post-attention one too, which our add_rms_norm computes
NORMS_OFF = {"rms_norm": False, "add_rms_norm": False}


@pytest.mark.parametrize(
    "switches, overrides",
    [
        ({"rope": False}, {"rope": False}),
        ({"rms_norm": False, "swiglu": False}, {**NORMS_OFF, "swiglu": False}),
        ({"fused_linear_cross_entropy": False}, {"fused_linear_cross_entropy": False}),
        ({"rope": True, "rms_norm": True}, {"rope": True, "rms_norm": True, "add_rms_norm": True}),
    ],
)
def test_each_switch_passed_is_an_override_of_apply(llama, switches, overrides):
    handle = compat.apply_liger_kernel_to_llama(model=llama, **switches)
    assert handle is liger_registry.patch_handle(llama)
    assert _overrides(handle) == overrides
    installed = {
        **handle.report.counts(),
        "fused_linear_cross_entropy": handle.report.config.values["flce.enabled"],
    }
    assert {kernel: bool(installed.get(kernel)) for kernel in overrides} == overrides


# What the reference's switch patches on the type (its monkey_patch.py), as our kinds.
@pytest.mark.parametrize(
    "model_type, switches, overrides",
    [
        # apply_liger_kernel_to_qwen3_moe: swiglu swaps Qwen3MoeExperts for the fused experts
        ("qwen3_moe", {"swiglu": True}, {"moe_experts": True}),
        ("qwen3_moe", {"swiglu": False}, {"moe_experts": False}),
        # apply_liger_kernel_to_mixtral: swiglu swaps MixtralExperts; rms_norm every MixtralRMSNorm
        ("mixtral", {"swiglu": False, "rms_norm": False}, {"moe_experts": False, **NORMS_OFF}),
    ],
)
def test_a_switch_means_what_the_reference_patches_with_it_on_the_type(model_type, switches, overrides):
    model = tiny_model(model_type)
    handle = getattr(compat, f"apply_liger_kernel_to_{model_type}")(model=model, **switches)
    try:
        assert _overrides(handle) == overrides
        counts = handle.report.counts()
        assert {kind: bool(counts.get(kind)) for kind in overrides} == overrides
    finally:
        handle.revert()


def test_a_switch_that_maps_to_nothing_the_family_has_is_a_logged_warning(caplog):
    """The reference accepts swiglu for gpt_oss and patches nothing with it (its experts' SwiGLU is clamped)."""
    model = tiny_model("gpt_oss")
    with caplog.at_level(logging.WARNING, logger="liger_registry"):
        handle = compat.apply_liger_kernel_to_gpt_oss(swiglu=True, model=model)
    try:
        assert _overrides(handle) == {}
        assert handle.report.counts()["moe_experts"]  # the family entry's choice stands
    finally:
        handle.revert()
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.name == "liger_registry.compat.entry_points"
    assert record.getMessage() == (
        "apply_liger_kernel_to_gpt_oss: swiglu=True installs nothing on family 'gpt_oss': "
        "the reference patches nothing with it on gpt_oss"
    )


@pytest.mark.parametrize("value", [True, False])
def test_no_switch_a_reference_function_takes_raises(value):
    """Every switch of every function we serve, all on and all off: it resolves (explain) on its model types."""
    from liger_registry.compat.entry_points import ENTRY_POINTS, to_overrides

    registry = liger_registry.load_registry()
    for entry in ENTRY_POINTS:
        for model_type in [t for t in entry.types if t in registry.by_model_type]:
            switches = dict.fromkeys(entry.switches, value)
            overrides = to_overrides(entry.function_name, entry, model_type, switches)
            liger_registry.explain(model_type, registry=registry, **overrides)


def test_the_switch_table_names_only_our_kinds():
    from liger_registry.compat.entry_points import ENTRY_POINTS, SWITCH_KINDS, SWITCHES

    assert set(SWITCH_KINDS) == set(SWITCHES)
    for entry in ENTRY_POINTS:
        for switch in entry.switches:
            assert set(entry.kinds_of(switch)) <= set(OVERRIDE_PATHS), (entry.name, switch)


def test_the_class_wide_form_is_seen_by_patch_handle_revert_and_the_report(caplog):
    from transformers.models.llama import modeling_llama as ml

    forward = ml.LlamaForCausalLM.forward
    handle = compat.apply_liger_kernel_to_llama()
    try:
        model = tiny_model("llama")
        assert liger_registry.patch_handle(model) is handle
        assert "family llama (class-wide)" in str(liger_registry.patch_handle(model).report)
        with caplog.at_level(logging.WARNING, logger="liger_registry"):
            assert liger_registry.revert(model) is True
        assert "class-wide patch of family 'llama'" in caplog.text
        assert liger_registry.patch_handle(model) is None and not handle.active
        assert ml.LlamaForCausalLM.forward is forward
    finally:
        handle.revert()


def test_positional_arguments_bind_in_the_documented_order(llama):
    handle = compat.apply_liger_kernel_to_llama(False, model=llama)
    assert _overrides(handle) == {"rope": False}


def test_switches_left_out_keep_the_family_entry(llama):
    handle = compat.apply_liger_kernel_to_llama(model=llama)
    assert _overrides(handle) == {}
    assert handle.report.counts() == liger_registry.apply(copy.deepcopy(llama)).report.counts()


def test_with_logits_setting_reaches_apply(llama):
    """The reference's standard with-logits setting: fused head off, cross entropy on the logits."""
    handle = compat.apply_liger_kernel_to_llama(
        model=llama, fused_linear_cross_entropy=False, cross_entropy=True
    )
    assert _overrides(handle) == {"fused_linear_cross_entropy": False, "cross_entropy": True}


def test_a_kernel_the_family_lacks_switched_off_is_accepted(llama):
    handle = compat.apply_liger_kernel_to(llama, cross_entropy=False, rms_norm=False)
    assert _overrides(handle)["rms_norm"] is False


def test_the_generic_form_ignores_a_switch_the_type_does_not_take_with_a_warning(llama, caplog):
    """The reference's `_apply_liger_kernel_to_instance` drops it too (one liger_kernel_config serves every type)."""
    with caplog.at_level(logging.WARNING, logger="liger_registry"):
        handle = compat.apply_liger_kernel_to(llama, geglu=False, rope=False)
    assert _overrides(handle) == {"rope": False}
    assert "geglu=False is not a switch of apply_liger_kernel_to_llama" in caplog.text


def test_unknown_keyword_is_an_error_and_nothing_is_patched(llama):
    with pytest.raises(TypeError, match="geglu"):
        compat.apply_liger_kernel_to_llama(model=llama, geglu=False)
    with pytest.raises(TypeError, match="'rms_nrom'.*rope, cross_entropy"):
        compat.apply_liger_kernel_to(llama, rms_nrom=False)
    with pytest.raises(TypeError, match="chunk_mem_const"):
        compat.apply_liger_kernel_to(llama, chunk_mem_const=8)
    with pytest.raises(TypeError, match="rms_nrom"):
        compat.apply_liger_kernel_to_llava(rms_nrom=False)
    assert liger_registry.patch_handle(llama) is None


def test_the_reference_generic_names_take_a_liger_kernel_config(llama):
    """transformers' Trainer calls `_apply_liger_kernel_to_instance(model=model, **liger_kernel_config)`."""
    handle = compat._apply_liger_kernel_to_instance(model=llama, **{"rope": False, "swiglu": False})
    assert _overrides(handle) == {"rope": False, "swiglu": False}
    class_wide = compat._apply_liger_kernel("qwen2", rms_norm=False)
    try:
        assert class_wide.report.scope == "class-wide" and _overrides(class_wide) == NORMS_OFF
    finally:
        class_wide.revert()


def test_a_model_of_another_type_is_refused(llama):
    with pytest.raises(ValueError, match="'llama'.*apply_liger_kernel_to_llama"):
        compat.apply_liger_kernel_to_qwen2(model=llama)
    assert liger_registry.patch_handle(llama) is None


def test_the_language_model_types_a_function_serves_are_accepted():
    model = tiny_model("qwen2_vl_text")
    handle = compat.apply_liger_kernel_to_qwen2_vl(model=model, rope=False)
    try:
        assert handle.report.family == "qwen2_vl_text" and _overrides(handle) == {"rope": False}
    finally:
        handle.revert()


def test_without_a_model_the_classes_are_patched_and_revert():
    from transformers.models.llama import modeling_llama as ml

    norm, mlp = ml.LlamaRMSNorm.forward, ml.LlamaMLP.forward
    handle = compat.apply_liger_kernel_to_llama(rms_norm=False)
    try:
        assert handle.report.scope == "class-wide" and handle is liger_registry.patch_handle("llama")
        assert ml.LlamaRMSNorm.forward is norm and ml.LlamaMLP.forward is not mlp
    finally:
        handle.revert()
    assert ml.LlamaMLP.forward is mlp


def test_after_the_class_wide_form_an_instance_cannot_switch_a_kernel_off():
    handle = compat.apply_liger_kernel_to_llama()
    model = tiny_model("llama")
    try:
        with pytest.raises(liger_registry.PatchError, match=r"rms_norm=off.*apply\('llama'\)"):
            compat.apply_liger_kernel_to_llama(model=model, rms_norm=False)
        assert liger_registry.patch_handle(model) is handle  # the class-wide patch, no instance patch
    finally:
        handle.revert()


def test_apply_liger_kernel_to_takes_a_model_type_class_wide():
    handle = compat.apply_liger_kernel_to("llama", swiglu=False)
    try:
        assert handle.report.scope == "class-wide" and _overrides(handle) == {"swiglu": False}
    finally:
        handle.revert()


def test_a_type_the_registry_does_not_serve_raises_its_error():
    with pytest.raises(liger_registry.UnsupportedModelError, match="muse_glimmer"):
        compat.apply_liger_kernel_to_muse_glimmer()


# The README lists these as the reference's functions we do not serve; a family added for one moves it.
NOT_SERVED = {"muse_glimmer"}


def test_the_model_types_we_do_not_serve_are_the_ones_the_readme_lists():
    registry = liger_registry.load_registry()
    served = set()
    for model_type, name in DOCUMENTED_MODEL_TYPES.items():
        try:
            registry.family_for(model_type)
            served.add(name)
        except liger_registry.UnsupportedModelError:
            pass
    assert set(DOCUMENTED_APPLY) - served == NOT_SERVED


# --- end to end -------------------------------------------------------------------------------------------------


def _loss_and_grads(model, batch):
    model.train()
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize(
    "switches",
    [{}, {"rope": False, "swiglu": False}, {"fused_linear_cross_entropy": False, "cross_entropy": True}],
)
def test_tiny_llama_trains_as_with_apply(llama, switches):
    ours = copy.deepcopy(llama)
    batch = tiny_batch(llama)
    compat.apply_liger_kernel_to_llama(model=llama, **switches)
    liger_registry.apply(ours, **switches)
    try:
        loss, grads = _loss_and_grads(llama, batch)
        ref_loss, ref_grads = _loss_and_grads(ours, batch)
    finally:
        liger_registry.revert(ours)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads, strict=True))


def _save_tiny_llama(path):
    model = tiny_model("llama")
    model.save_pretrained(path)
    return model


def test_auto_model_loads_and_patches_the_instance(tmp_path):
    from transformers import AutoModelForCausalLM

    _save_tiny_llama(tmp_path)
    model = compat.AutoLigerKernelForCausalLM.from_pretrained(tmp_path, rope=False, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    try:
        handle = liger_registry.patch_handle(model)
        assert (
            handle is not None and handle.report.scope == "instance" and _overrides(handle) == {"rope": False}
        )
        assert liger_registry.patch_handle("llama") is None  # nothing class-wide
        liger_registry.apply(plain, rope=False)
        batch = tiny_batch(model)
        assert torch.equal(_loss_and_grads(model, batch)[0], _loss_and_grads(plain, batch)[0])
    finally:
        liger_registry.revert(model)
        liger_registry.revert(plain)


def test_auto_model_from_config_patches():
    config = tiny_model("llama").config
    model = compat.AutoLigerKernelForCausalLM.from_config(config, swiglu=False)
    try:
        assert _overrides(liger_registry.patch_handle(model)) == {"swiglu": False}
    finally:
        liger_registry.revert(model)


def test_auto_model_refuses_an_unserved_type_before_reading_weights(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)  # config only: no weights to read
    with pytest.raises(liger_registry.UnsupportedModelError, match="gpt2"):
        compat.AutoLigerKernelForCausalLM.from_pretrained(tmp_path)


# --- loss modules and functional names ---------------------------------------------------------------------------

N, V, H = 12, 40, 16


@pytest.fixture(params=["auto", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("LIGER_REGISTRY_BACKEND", request.param)
    return request.param


def _targets(ignore_index: int) -> torch.Tensor:
    target = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(1))
    target[::4] = ignore_index
    return target


def _class_weights() -> torch.Tensor:
    return torch.rand(V, generator=torch.Generator().manual_seed(2)) + 0.5


CE_CASES = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"label_smoothing": 0.1},
    {"ignore_index": 3},
    {"weight": "class"},
    {"weight": "class", "label_smoothing": 0.2, "reduction": "sum"},
]


def _torch_kwargs(case: dict) -> dict:
    out = dict(case)
    if out.get("weight") == "class":
        out["weight"] = _class_weights()
    return out


def _check_against_torch(ours_fn, torch_fn, *inputs):
    ours_in = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ref_in = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ours, ref = ours_fn(*ours_in), torch_fn(*ref_in)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    ours.sum().backward()
    ref.sum().backward()
    for a, b in zip(ours_in, ref_in, strict=True):
        if a.is_floating_point():
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CE_CASES, ids=str)
def test_cross_entropy_loss_module_equals_torch(backend, case):
    kwargs = _torch_kwargs(case)
    logits = torch.randn(N, V, generator=torch.Generator().manual_seed(0))
    target = _targets(kwargs.get("ignore_index", -100))
    module = compat.LigerCrossEntropyLoss(**kwargs)
    _check_against_torch(module, lambda x, t: F.cross_entropy(x, t, **kwargs), logits, target)


@pytest.mark.parametrize("case", CE_CASES, ids=str)
def test_fused_linear_cross_entropy_loss_module_equals_torch(backend, case):
    kwargs = _torch_kwargs(case)
    gen = torch.Generator().manual_seed(0)
    hidden, weight, bias = (
        torch.randn(N, H, generator=gen),
        torch.randn(V, H, generator=gen),
        torch.randn(V, generator=gen),
    )
    target = _targets(kwargs.get("ignore_index", -100))
    ours_kwargs = {("ce_weight" if k == "weight" else k): v for k, v in kwargs.items()}
    module = compat.LigerFusedLinearCrossEntropyLoss(**ours_kwargs)
    _check_against_torch(
        lambda w, h, b, t: module(w, h, t, b),
        lambda w, h, b, t: F.cross_entropy(h @ w.T + b, t, **kwargs),
        weight,
        hidden,
        bias,
        target,
    )


def test_functional_names_equal_torch(backend):
    gen = torch.Generator().manual_seed(0)
    logits, hidden, weight = (
        torch.randn(N, V, generator=gen),
        torch.randn(N, H, generator=gen),
        torch.randn(V, H, generator=gen),
    )
    target = _targets(-100)
    _check_against_torch(
        lambda x, t: compat.liger_cross_entropy(x, t, None, None, -100, None, "mean", 0.1),
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        logits,
        target,
    )
    _check_against_torch(
        lambda h, w, t: compat.liger_fused_linear_cross_entropy(h, w, t, chunk_mem_const=2, reduction="sum"),
        lambda h, w, t: F.cross_entropy(h @ w.T, t, reduction="sum"),
        hidden,
        weight,
        target,
    )
    a, b = torch.randn(N, H, generator=gen), torch.randn(N, H, generator=gen)
    _check_against_torch(compat.liger_swiglu, lambda x, y: F.silu(x) * y, a, b)
    _check_against_torch(compat.liger_geglu, lambda x, y: F.gelu(x, approximate="tanh") * y, a, b)
    w, bias = torch.randn(H, generator=gen), torch.randn(H, generator=gen)
    _check_against_torch(
        lambda x, w_, b_: compat.liger_layer_norm(x, w_, b_, 1e-5),
        lambda x, w_, b_: F.layer_norm(x, (H,), w_, b_, 1e-5),
        a,
        w,
        bias,
    )


def _z_loss_and_accuracy(logits, target, ignore_index=-100, scale=1e-2):
    valid = target != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    z_loss = scale * (lse[valid] ** 2).mean()
    accuracy = (logits.argmax(-1)[valid] == target[valid]).float().mean()
    return z_loss, accuracy


def test_fused_linear_cross_entropy_module_structured_output():
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(N, H, generator=gen), torch.randn(V, H, generator=gen)
    target = _targets(-100)
    module = compat.LigerFusedLinearCrossEntropyLoss(
        lse_square_scale=1e-2, return_z_loss=True, return_token_accuracy=True
    )
    out = module(weight, hidden, target)
    logits = hidden @ weight.T
    z_loss, accuracy = _z_loss_and_accuracy(logits, target)
    torch.testing.assert_close(out.loss, F.cross_entropy(logits, target) + z_loss)
    torch.testing.assert_close(out.z_loss, z_loss)
    torch.testing.assert_close(out.token_accuracy, accuracy)
    assert out.predicted_tokens is None


def test_cross_entropy_module_structured_output():
    logits = torch.randn(N, V, generator=torch.Generator().manual_seed(0))
    target = _targets(-100)
    module = compat.LigerCrossEntropyLoss(
        lse_square_scale=1e-2, return_z_loss=True, return_token_accuracy=True, return_predicted_tokens=True
    )
    out = module(logits, target)
    z_loss, accuracy = _z_loss_and_accuracy(logits, target)
    torch.testing.assert_close(out.loss, F.cross_entropy(logits, target) + z_loss)
    torch.testing.assert_close(out.z_loss, z_loss)
    torch.testing.assert_close(out.token_accuracy, accuracy)
    valid = target != -100
    assert torch.equal(out.predicted_tokens[valid], logits.argmax(-1)[valid])


def test_an_argument_we_do_not_support_is_named():
    logits, target = torch.randn(N, V), _targets(-100)
    with pytest.raises(TypeError, match="size_average=True"):
        compat.liger_cross_entropy(logits, target, size_average=True)
    with pytest.raises(TypeError, match="reduce=False"):
        compat.liger_cross_entropy(logits, target, reduce=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda: compat.LigerCrossEntropyLoss(reduction="avg"),
        lambda: compat.LigerCrossEntropyLoss(label_smoothing=1.5),
        lambda: compat.LigerFusedLinearCrossEntropyLoss(softcap=-1.0),
        lambda: compat.LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.int32),
    ],
)
def test_bad_constructor_values_are_refused_at_construction(make):
    with pytest.raises(ValueError):
        make()


def test_every_documented_switch_is_a_liger_kernel_config_key():
    from liger_registry.integrations import LIGER_KEYS, overrides_from_liger_kernel_config

    documented = {p for params in DOCUMENTED_APPLY.values() for p, _ in params} - {"model", "**kwargs"}
    assert documented <= set(LIGER_KEYS)
    assert overrides_from_liger_kernel_config({"relu_squared": False}, "nemotron") == {"relu_squared": False}


def test_auto_model_refuses_a_switch_the_type_lacks_before_loading(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    _save_tiny_llama(tmp_path)

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(TypeError, match="'geglu'"):
        compat.AutoLigerKernelForCausalLM.from_pretrained(tmp_path, geglu=False)


def test_switches_a_function_forwards_reach_apply_class_wide():
    handle = compat.apply_liger_kernel_to_llava(rms_norm=False, fused_linear_cross_entropy=False)
    try:
        assert handle.report.family == "llava" and handle.report.scope == "class-wide"
        # llava's entry has no add_rms_norm
        assert _overrides(handle) == {"rms_norm": False, "fused_linear_cross_entropy": False}
    finally:
        handle.revert()


def test_the_readme_section_starts_with_a_before_after_snippet_that_runs(run_readme_snippet):
    code, stdout = run_readme_snippet("Coming from liger-kernel")
    assert "# before: from liger_kernel" in code and "from liger_registry.compat import" in code
    assert "family llama (instance)" in stdout
