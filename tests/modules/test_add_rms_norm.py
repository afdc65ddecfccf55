"""The fused add + RMSNorm decoder-layer forward: equal to the unpatched layer (outputs and gradients, fp32) in
every family that turns it on, refused with the reason where the layer or its norm does not fit, and taken back
by revert."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch import nn
from transformers.models.llama import modeling_llama

import liger_registry
from liger_registry import kernels
from liger_registry.modules.add_rms_norm import add_rms_norm_layer_forward
from liger_registry.modules.layer_shape import layer_shape
from liger_registry.registry.loader import load_registry
from liger_registry.registry.plan import make_plan
from liger_registry.registry.resolve import resolve
from liger_registry.registry.targets import resolve_class
from liger_registry.testing import tiny_batch, tiny_model

REGISTRY = load_registry()
FAMILIES = sorted(n for n, f in REGISTRY.families.items() if f.entry.kernels.add_rms_norm is not None)


def _first_layer(model, entry):
    classes = tuple(resolve_class(entry, t) for t in entry.kernels.add_rms_norm.targets)
    return next(m for m in model.modules() if isinstance(m, classes))


def _layer_call(model, layer) -> tuple[tuple, dict]:
    """The arguments the model passes its layer (captured from one forward)."""
    seen = {}

    def hook(module, args, kwargs):
        seen.setdefault("call", (args, kwargs))

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=tiny_batch(model, seq=7)["input_ids"], use_cache=False)
    finally:
        handle.remove()
    return seen["call"]


def _run(layer, args, kwargs, weights):
    torch.manual_seed(0)  # the same dropout masks, if a tiny config has dropout
    hidden = args[0].detach().clone().requires_grad_(True)
    out = layer(hidden, *args[1:], **kwargs)
    (out * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    layer.zero_grad(set_to_none=True)
    return out.detach(), hidden.grad, grads


def test_the_kind_is_on_in_the_llama_shaped_families():
    assert {"llama", "mistral", "qwen2", "qwen3", "gemma"} <= set(FAMILIES)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_layer_equals_the_unpatched_layer(family, backend, monkeypatch):
    monkeypatch.setenv("LIGER_REGISTRY_BACKEND", backend)
    assert kernels.decide_backend("add_rms_norm", "cpu", torch.float32)[0] == backend
    torch.manual_seed(0)
    entry = REGISTRY.family(family).entry
    model = tiny_model(entry.model_types[0]).float()
    layer = _first_layer(model, entry)
    spec = entry.kernels.add_rms_norm
    with torch.no_grad():  # a non-trivial norm weight, so the casting and the offset are checked
        getattr(getattr(layer, layer_shape(type(layer)).post_norm), spec.weight_attr).normal_()
    args, kwargs = _layer_call(model, layer)
    layer.train()
    weights = torch.randn(args[0].shape)
    want = _run(layer, args, kwargs, weights)
    patched = copy.deepcopy(layer)
    patched.forward = types.MethodType(add_rms_norm_layer_forward(spec), patched)
    got = _run(patched, args, kwargs, weights)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-5, atol=1e-5, msg=name)


def _mini(tmp_path, kernels: str):
    (tmp_path / "mini.yaml").write_text(
        "family: mini\nmodel_types: [mini_llama]\nmodule: transformers.models.llama.modeling_llama\n"
        f"causal_lm: LlamaForCausalLM\nkernels:\n{kernels}"
    )
    registry = load_registry(tmp_path)
    return resolve(registry, registry.family("mini"))


def _problems(resolved, model=None) -> list[str]:
    return [p for p in make_plan(resolved, model).problems if p.startswith("add_rms_norm")]


@pytest.mark.parametrize(
    ("kernels", "reason"),
    [
        (
            "  add_rms_norm: {targets: [LlamaDecoderLayer]}\n",
            "LlamaDecoderLayer: the family's rms_norm kernel declares none",
        ),
        (
            "  rms_norm: {targets: [LlamaRMSNorm], enabled: false, reason: kept eager}\n"
            "  add_rms_norm: {targets: [LlamaDecoderLayer]}\n",
            "the family's rms_norm kernel is off (kept eager)",
        ),
        (
            "  rms_norm: {targets: [LlamaRMSNorm]}\n"
            "  add_rms_norm: {targets: [LlamaDecoderLayer], casting_mode: gemma, offset: 1.0}\n",
            "differ from the family's rms_norm",
        ),
        (
            "  rms_norm: {targets: [LlamaMLP]}\n  add_rms_norm: {targets: [LlamaDecoderLayer]}\n",
            "its post_attention_layernorm is LlamaRMSNorm, not the family's RMSNorm (LlamaMLP)",
        ),
        (
            "  rms_norm: {targets: [LlamaRMSNorm]}\n"
            "  add_rms_norm: {targets: ['transformers.models.gemma2.modeling_gemma2:Gemma2DecoderLayer']}\n",
            "Gemma2DecoderLayer: its forward is not the llama-shaped",
        ),
    ],
)
def test_a_layer_or_norm_that_does_not_fit_is_refused_with_the_reason(tmp_path, kernels, reason):
    problems = _problems(_mini(tmp_path, kernels))
    assert len(problems) == 1 and reason in problems[0], problems


def test_a_model_whose_post_attention_norm_is_another_module_is_refused(tmp_path):
    resolved = _mini(
        tmp_path, "  rms_norm: {targets: [LlamaRMSNorm]}\n  add_rms_norm: {targets: [LlamaDecoderLayer]}\n"
    )
    model = tiny_model("llama")
    model.model.layers[1].post_attention_layernorm = nn.LayerNorm(model.config.hidden_size)
    problems = _problems(resolved, model)
    assert problems == [
        "add_rms_norm: model.layers.1: LlamaDecoderLayer: its post_attention_layernorm is LayerNorm, not the "
        "family's RMSNorm (LlamaRMSNorm)"
    ]
    with pytest.raises(liger_registry.PatchError, match="post_attention_layernorm is LayerNorm"):
        liger_registry.apply(model)
    assert "forward" not in vars(model.model.layers[0])  # strict: nothing was changed


def test_apply_installs_on_every_layer_and_revert_restores_the_forward():
    model = tiny_model("llama")
    layers = list(model.model.layers)
    handle = liger_registry.apply(model)
    assert [r.target for r in handle.report.patched if r.kernel == "add_rms_norm"] == [
        f"model.layers.{i}" for i in range(len(layers))
    ]
    assert all("forward" in vars(layer) for layer in layers)
    handle.revert()
    assert all("forward" not in vars(layer) for layer in layers)
    assert all(layer.forward.__func__ is modeling_llama.LlamaDecoderLayer.forward for layer in layers)


def test_class_wide_apply_and_revert_restore_the_class_forward():
    original = modeling_llama.LlamaDecoderLayer.forward
    handle = liger_registry.apply("llama")
    try:
        assert modeling_llama.LlamaDecoderLayer.forward is not original
        assert any(r.kernel == "add_rms_norm" for r in handle.report.patched)
    finally:
        handle.revert()
    assert modeling_llama.LlamaDecoderLayer.forward is original


def test_rms_norm_switched_off_leaves_the_fused_add_norm_on():
    model = tiny_model("llama")
    with liger_registry.patched(model, rms_norm=False) as handle:
        kernels_on = {r.kernel for r in handle.report.patched}
        assert "add_rms_norm" in kernels_on and "rms_norm" not in kernels_on


def test_the_kind_can_be_turned_off_by_override():
    model = tiny_model("llama")
    with liger_registry.patched(model, add_rms_norm=False) as handle:
        assert not any(r.kernel == "add_rms_norm" for r in handle.report.patched)
        assert "add_rms_norm" in handle.report.skipped
        assert "forward" not in vars(model.model.layers[0])


@pytest.mark.parametrize("class_wide", [False, True])
def test_the_fused_kernel_runs_in_every_layer_under_apply(monkeypatch, class_wide):
    """The fused add + norm really runs (once per layer) whether the norms are patched per instance or class-wide,
    and falls back to the norm module only where a wrapper or hook sits on it (accelerate's offload)."""
    import liger_registry as L
    from liger_registry.modules import add_rms_norm as module
    from liger_registry.testing import tiny_batch, tiny_model

    calls = []
    real = module.add_rms_norm
    monkeypatch.setattr(module, "add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_model("llama")
    handle = L.apply("llama") if class_wide else L.apply(model)
    try:
        model(**tiny_batch(model))
        assert len(calls) == model.config.num_hidden_layers
        calls.clear()
        norm = model.model.layers[0].post_attention_layernorm
        hook = norm.register_forward_pre_hook(lambda *_: None)
        model(**tiny_batch(model))
        assert len(calls) == model.config.num_hidden_layers - 1
        hook.remove()
    finally:
        handle.revert()
