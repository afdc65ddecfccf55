"""The generic applier: what it replaces, that revert restores the same objects, and loud failures."""

import pytest
import torch
from transformers.models.llama import modeling_llama

import liger_registry
from liger_registry.registry.errors import PatchError, RegistryError, UnsupportedModelError
from liger_registry.testing import tiny_batch, tiny_model


def snapshot(model):
    """Every module's own __dict__ entries that a patch could touch, plus the module-level rope function."""
    own = {name: dict(vars(m)).get("forward") for name, m in model.named_modules()}
    return own, modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaForCausalLM.forward


@pytest.fixture
def llama():
    model = tiny_model("llama")
    yield model
    liger_registry.revert(model)


def test_apply_replaces_each_attribute_once_and_reports_it(llama):
    handle = liger_registry.apply(llama)
    counts = handle.report.counts()
    layers = llama.config.num_hidden_layers
    assert counts == {
        "rms_norm": 2 * layers + 1,
        "add_rms_norm": layers,
        "rope": layers,
        "swiglu": layers,
        "forward": 2,  # the causal-LM head, and the base model's masks of default positions
    }
    assert len(handle.report.patched) == sum(counts.values())
    assert "LlamaRMSNorm.forward" in str(handle.report)
    # rope is patched per instance: each attention's forward calls the kernel, the module keeps HF's function
    assert "liger_registry.modules.rope.apply_rotary_pos_emb" in str(handle.report)
    assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__


def test_revert_restores_the_same_objects(llama):
    before = snapshot(llama)
    handle = liger_registry.apply(llama)
    assert snapshot(llama) != before
    handle.revert()
    assert snapshot(llama) == before
    assert all("forward" not in vars(m) for m in llama.modules())
    handle.revert()  # a second revert is a no-op
    assert liger_registry.revert(llama) is False


def test_apply_is_idempotent(llama):
    first = liger_registry.apply(llama)
    assert liger_registry.apply(llama) is first
    with pytest.raises(PatchError, match="other options"):
        liger_registry.apply(llama, chunk_mem_const=4)


def test_patched_context_reverts_on_error(llama):
    before = snapshot(llama)
    with pytest.raises(RuntimeError), liger_registry.patched(llama):
        assert snapshot(llama) != before
        raise RuntimeError("body failed")
    assert snapshot(llama) == before


def test_patched_blocks_restore_the_state_they_found(llama):
    """An inner `with patched(m)` on an already patched model leaves the outer patch in place."""
    before = snapshot(llama)
    outer = liger_registry.apply(llama)
    patched_state = snapshot(llama)
    with liger_registry.patched(llama) as inner:
        assert inner is outer
        with liger_registry.patched(llama):
            pass
        assert snapshot(llama) == patched_state
    assert outer.active and snapshot(llama) == patched_state
    outer.revert()
    assert snapshot(llama) == before


def test_module_wide_function_stays_patched_while_another_holder_holds_it(llama):
    """Class-wide patches replace the module function; it stays replaced until its last holder reverts."""
    original = modeling_llama.apply_rotary_pos_emb
    first = liger_registry.apply("llama")
    second = liger_registry.apply("llama", registry=liger_registry.load_registry())
    assert second is first
    instance = liger_registry.apply(llama)
    first.revert()
    assert modeling_llama.apply_rotary_pos_emb is original
    instance.revert()
    assert modeling_llama.apply_rotary_pos_emb is original


def test_model_type_patches_classes_and_reverts():
    cls_forward = modeling_llama.LlamaForCausalLM.forward
    norm_forward = modeling_llama.LlamaRMSNorm.forward
    handle = liger_registry.apply("llama")
    try:
        assert modeling_llama.LlamaForCausalLM.forward is not cls_forward
        model = tiny_model("llama")
        model.train()
        assert model(**tiny_batch(model)).logits is None
        assert handle.report.scope == "class-wide"
    finally:
        handle.revert()
    assert modeling_llama.LlamaForCausalLM.forward is cls_forward
    assert modeling_llama.LlamaRMSNorm.forward is norm_forward


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"chunk_mem_cnst": 2}, RegistryError),
        ({"chunk_mem_const": False}, RegistryError),
        ({"policy": "/nonexistent/policy.yaml"}, RegistryError),
    ],
)
def test_bad_input_errors_and_leaves_model_unpatched(llama, kwargs, error):
    before = snapshot(llama)
    with pytest.raises(error):
        liger_registry.apply(llama, **kwargs)
    assert snapshot(llama) == before


def test_unknown_model_type_errors():
    with pytest.raises(UnsupportedModelError, match="Supported"):
        liger_registry.apply("not_a_model")


def test_a_patch_that_matches_nothing_is_an_error_or_a_warning(llama, tmp_path):
    (tmp_path / "odd.yaml").write_text(
        "family: odd\nmodel_types: [odd_llama]\nmodule: transformers.models.llama.modeling_llama\n"
        "causal_lm: LlamaForCausalLM\nkernels:\n  layer_norm: {targets: [LlamaAttention]}\n"
        "  rms_norm: {targets: [LlamaRMSNorm]}\n"
    )
    registry = liger_registry.load_registry(tmp_path)
    llama.config.model_type = "odd_llama"
    before = snapshot(llama)
    with pytest.raises(PatchError, match="layer_norm: .*LlamaAttention.* has no attribute eps"):
        liger_registry.apply(llama, registry=registry)
    assert snapshot(llama) == before
    with pytest.warns(UserWarning, match="layer_norm"):
        handle = liger_registry.apply(llama, registry=registry, strict=False)
    assert "layer_norm" not in handle.report.counts() and handle.report.counts()["rms_norm"] > 0
    handle.revert()


def test_failure_half_way_rolls_back(llama, monkeypatch):
    from liger_registry.registry import applier

    before = snapshot(llama)
    real = applier.PatchHandle._install
    calls = []

    def flaky(self, planned):
        calls.append(planned)
        if len(calls) == 4:
            raise RuntimeError("simulated failure")
        real(self, planned)

    monkeypatch.setattr(applier.PatchHandle, "_install", flaky)
    with pytest.raises(PatchError, match="rolled back"):
        liger_registry.apply(llama)
    assert snapshot(llama) == before
    assert liger_registry.patch_handle(llama) is None


def test_disabled_kernel_is_reported_as_skipped(llama):
    handle = liger_registry.apply(llama, swiglu=False)
    assert "swiglu" not in handle.report.counts() and "swiglu" in handle.report.skipped


def test_not_a_causal_lm_needs_flce_off():
    from transformers import LlamaModel

    from liger_registry.testing import tiny_config

    model = LlamaModel(tiny_config("llama"))
    with pytest.raises(PatchError, match="not a LlamaForCausalLM"):
        liger_registry.apply(model)
    handle = liger_registry.apply(model, fused_linear_cross_entropy=False)
    assert handle.report.counts()["rms_norm"] > 0
    handle.revert()


def test_patched_model_trains_with_same_gradients(llama):
    batch = tiny_batch(llama)
    llama.train()
    llama(**batch).loss.backward()
    reference = {n: p.grad.clone() for n, p in llama.named_parameters()}
    llama.zero_grad()
    with liger_registry.patched(llama):
        llama(**batch).loss.backward()
    for name, param in llama.named_parameters():
        torch.testing.assert_close(param.grad, reference[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (
            {"lm_head": "save_pretrained"},
            "head.lm_head: LlamaForCausalLM.save_pretrained is a method, not a module",
        ),
        ({"lm_head": "model"}, "head.lm_head: LlamaForCausalLM.model is a LlamaModel without a weight"),
        ({"base_model": "config"}, "head.base_model: LlamaForCausalLM.config is a LlamaConfig, not a module"),
    ],
)
def test_a_head_attribute_that_is_no_module_is_refused_at_apply(llama, head, says):
    from liger_registry.registry.loader import LoadedFamily, Registry

    loaded = liger_registry.load_registry().family_for("llama")
    entry = loaded.entry.model_copy(update={"head": loaded.entry.head.model_copy(update=head)})
    registry = Registry({"llama": LoadedFamily(entry, loaded.path)}, {"llama": "llama"})
    before = snapshot(llama)
    with pytest.raises(PatchError, match=says):
        liger_registry.apply(llama, registry=registry)
    assert snapshot(llama) == before
