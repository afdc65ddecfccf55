"""liger_kernel_config (the dict TrainingArguments takes) to liger_registry overrides."""

from __future__ import annotations

import re
import warnings

import pytest

import liger_registry as L
from liger_registry.integrations import LIGER_KEYS, overrides_from_liger_kernel_config
from liger_registry.registry import load_registry
from liger_registry.testing import tiny_model


def test_false_turns_a_kernel_off_and_true_keeps_the_family_default():
    config = {"rope": True, "rms_norm": False, "swiglu": True, "fused_linear_cross_entropy": False}
    assert overrides_from_liger_kernel_config(config, "llama") == {
        "rms_norm": False,
        "add_rms_norm": False,
        "fused_linear_cross_entropy": False,
    }
    model = tiny_model("llama")
    with L.patched(model, **overrides_from_liger_kernel_config(config, "llama")) as handle:
        # FLCE off: the forward stays installed (it owns skip_logits), computing the loss from logits
        # rms_norm=False: every RMSNorm stays transformers', the post-attention one too (the fused add + norm)
        assert {r.kernel for r in handle.report.patched} == {"rope", "swiglu", "forward"}
        assert "fused_linear_cross_entropy" in handle.report.skipped


def test_a_key_means_what_the_reference_switch_patches_on_the_type():
    """As the compat functions (one table): qwen3_moe's swiglu is the fused experts."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert overrides_from_liger_kernel_config({"swiglu": False}, "qwen3_moe") == {"moe_experts": False}
        assert overrides_from_liger_kernel_config({"swiglu": True}, "qwen3_moe") == {}


def test_every_bad_key_and_value_is_reported_at_once():
    with pytest.raises(ValueError) as err:
        overrides_from_liger_kernel_config({"rms_nrom": True, "swiglu": "yes", "model": None})
    text = str(err.value)
    assert "'rms_nrom' (did you mean 'rms_norm'?)" in text and "swiglu: expected true or false" in text
    assert "'model'" in text and ", ".join(LIGER_KEYS) in text


def _swiglu_off_with_a_reason() -> tuple[str, str, str]:
    """A bundled family that keeps swiglu off with a reason (which ones do changes as kernels gain options)."""
    for name, loaded in sorted(load_registry().families.items()):
        swiglu = loaded.entry.kernels.swiglu
        if swiglu is not None and not swiglu.enabled and swiglu.reason:
            return name, loaded.entry.model_types[0], swiglu.reason
    pytest.skip("no bundled family keeps swiglu off")


def test_off_for_a_kernel_the_family_lacks_is_a_no_op_off_in_the_family_is_a_warning():
    # passed on, so that apply reports the no-op (tests/registry/test_switches.py: on is an error)
    assert overrides_from_liger_kernel_config({"geglu": False, "layer_norm": False}, "llama") == {
        "geglu": False,
        "layer_norm": False,
    }
    family, model_type, reason = _swiglu_off_with_a_reason()
    with pytest.warns(
        UserWarning, match=re.escape(f"swiglu=True: family '{family}' does not install it: {reason}")
    ):
        assert overrides_from_liger_kernel_config({"swiglu": True}, model_type) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        overrides_from_liger_kernel_config({"rms_norm": True, "rope": True}, "gpt_oss")
