"""The reference library's kernel switches on every family: off for a kernel the family lacks is a reported no-op,
on for one it cannot have is an error naming what it has; cross_entropy is a switch of every causal-LM head."""

from __future__ import annotations

import pytest

import liger_registry as L
from liger_registry.integrations import overrides_from_liger_kernel_config
from liger_registry.registry.errors import RegistryError
from liger_registry.testing import tiny_model

REGISTRY = L.load_registry()
WITH_HEAD = sorted(n for n, f in REGISTRY.families.items() if f.entry.head is not None)
HEADLESS = sorted(n for n, f in REGISTRY.families.items() if f.entry.head is None)
REFERENCE_SWITCHES = ("rope", "rms_norm", "swiglu", "geglu", "layer_norm", "cross_entropy")


@pytest.mark.parametrize("family", WITH_HEAD)
def test_every_causal_lm_head_takes_cross_entropy_on_and_off(family):
    model_type = REGISTRY.families[family].entry.model_types[0]
    assert L.explain(model_type, cross_entropy=True).value("cross_entropy.enabled") is True
    assert L.explain(model_type, cross_entropy=False).value("cross_entropy.enabled") is False


@pytest.mark.parametrize("family", sorted(REGISTRY.families))
def test_every_reference_switch_off_is_accepted_by_every_family(family):
    model_type = REGISTRY.families[family].entry.model_types[0]
    L.explain(model_type, **dict.fromkeys(REFERENCE_SWITCHES, False), fused_linear_cross_entropy=False)


def test_off_for_a_kernel_the_family_lacks_is_a_reported_no_op():
    explanation = L.explain("llama", geglu=False, layer_norm=False)
    text = str(explanation)
    assert "geglu: family 'llama' has no geglu kernel: nothing to switch off (override)" in text
    assert "layer_norm: family 'llama' has no layer_norm kernel" in text
    model = tiny_model("llama")
    with L.patched(model, geglu=False, layer_norm=False) as handle:
        assert "has no geglu kernel: nothing to switch off" in handle.report.skipped["geglu"]
        assert "layer_norm" in handle.report.skipped and "geglu" not in handle.report.counts()
        assert "geglu" in str(handle.report)


@pytest.mark.parametrize(
    "family, switch",
    [("llama", "geglu"), ("llama", "layer_norm"), ("gemma", "swiglu"), ("gpt_oss", "swiglu")],
)
def test_on_for_a_kernel_the_family_cannot_have_names_what_it_has(family, switch):
    with pytest.raises(RegistryError) as err:
        L.explain(family, **{switch: True})
    text = str(err.value)
    assert f"family {family!r} has no {switch} kernel" in text
    has = [k for k, spec in REGISTRY.families[family].entry.kernels if spec is not None]
    assert all(k in text for k in (*has, "cross_entropy", "fused_linear_cross_entropy"))
    with pytest.raises(RegistryError, match=f"has no {switch} kernel"):
        L.apply(tiny_model(family), **{switch: True})


@pytest.mark.parametrize("family", HEADLESS)
def test_cross_entropy_on_a_family_without_a_head_is_an_error(family):
    model_type = REGISTRY.families[family].entry.model_types[0]
    with pytest.raises(RegistryError, match="no causal-LM head"):
        L.explain(model_type, cross_entropy=True)
    L.explain(model_type, cross_entropy=False)


def test_liger_kernel_config_follows_the_same_rule():
    assert overrides_from_liger_kernel_config({"geglu": False, "layer_norm": False}, "llama") == {
        "geglu": False,
        "layer_norm": False,
    }
    # one TrainingArguments config serves every model: a kernel the family lacks is dropped, with a warning
    with pytest.warns(
        UserWarning, match="keys ignored: family .llama. has no geglu kernel; its switches: rms_norm"
    ):
        assert overrides_from_liger_kernel_config({"geglu": True, "rope": False}, "llama") == {"rope": False}
    with pytest.raises(RegistryError, match="family 'llama' has no geglu kernel"):
        L.explain("llama", geglu=True)
    # cross_entropy is off by default (an opt-in of every head): true switches it on
    assert overrides_from_liger_kernel_config({"cross_entropy": True}, "llama") == {"cross_entropy": True}
    assert overrides_from_liger_kernel_config({"cross_entropy": True}, "llama4") == {"cross_entropy": True}
