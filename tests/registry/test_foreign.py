"""apply refuses a model (or family) another patcher already changed, naming it and what to do. The reference
library is simulated by code whose __module__ is liger_kernel.* (it is never imported)."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.llama import modeling_llama

import liger_registry as L
from liger_registry.registry.foreign import patcher_of
from liger_registry.testing import tiny_model


def _foreign(fn, module="liger_kernel.transformers.rms_norm"):
    fn.__module__ = module
    return fn


class LigerRMSNorm(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * self.weight


LigerRMSNorm.__module__ = "liger_kernel.transformers.rms_norm"


def _refused(model, match):
    before = {name: vars(m).get("forward") for name, m in model.named_modules()}
    with pytest.raises(L.PatchError, match=match) as info:
        L.apply(model)
    assert L.patch_handle(model) is None
    assert before == {name: vars(m).get("forward") for name, m in model.named_modules()}, "nothing changed"
    return str(info.value)


def test_instance_forward_bound_by_the_reference_library():
    model = tiny_model("llama")
    norm = model.model.layers[0].input_layernorm
    norm.forward = types.MethodType(_foreign(lambda self, x: x), norm)
    text = _refused(model, "already patched by liger-kernel")
    assert "model.layers.0.input_layernorm.forward" in text
    assert "use_liger_kernel_flag" in text and "afresh" in text


def test_module_replaced_by_a_reference_library_class():
    model = tiny_model("llama")
    model.model.norm = LigerRMSNorm(model.config.hidden_size)
    text = _refused(model, "liger-kernel")
    assert "model.norm is a liger_kernel.transformers.rms_norm.LigerRMSNorm" in text


def test_causal_lm_forward_replaced():
    model = tiny_model("llama")
    model.forward = types.MethodType(
        _foreign(lambda self, **kw: None, "liger_kernel.transformers.model.llama"), model
    )
    assert "(root).forward" in _refused(model, "liger-kernel")


def test_module_function_and_class_swapped_in_the_modeling_module(monkeypatch):
    model = tiny_model("llama")  # built before the class-level patch, as in the issue
    monkeypatch.setattr(
        modeling_llama,
        "apply_rotary_pos_emb",
        _foreign(lambda *a, **k: None, "liger_kernel.transformers.rope"),
    )
    monkeypatch.setattr(modeling_llama, "LlamaRMSNorm", LigerRMSNorm)
    text = _refused(model, "liger-kernel")
    assert "apply_rotary_pos_emb" in text and "modeling_llama.LlamaRMSNorm is liger_kernel" in text
    with pytest.raises(L.PatchError, match="family 'llama' is already patched by liger-kernel"):
        L.apply("llama")
    assert L.patch_handle("llama") is None


def test_other_patchers_are_named_and_our_own_code_is_not():
    assert patcher_of(_foreign(lambda: None, "unsloth.models.llama")) == "Unsloth"
    assert patcher_of(_foreign(lambda: None, "cut_cross_entropy.transformers.llama")) == "cut-cross-entropy"
    model = tiny_model("llama")
    handle = L.apply(model)
    assert patcher_of(model.forward) is None
    assert L.apply(model) is handle  # re-applying over our own patch is not a foreign patch
    handle.revert()
