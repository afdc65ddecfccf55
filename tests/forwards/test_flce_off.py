"""The forward is installed with FLCE off too ("never fuse") and owns skip_logits: llama, and llama4's head."""

import inspect

import pytest
import torch
from transformers import modeling_outputs

import liger_registry
from liger_registry.testing import tiny_batch, tiny_model


def _check_contract(model, reference, batch):
    """The four documented behaviours of a forward that does not fuse, with the unpatched model as the reference."""
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        model.train(), reference.train()
        expected = reference(**batch)
        default = model(**batch)  # auto, nothing fused: the logits it computed come back, as unpatched
        assert default.logits is not None, "skip_logits=None with FLCE off dropped the logits in training"
        torch.testing.assert_close(default.logits, expected.logits)
        torch.testing.assert_close(default.loss, expected.loss)
        expected = expected.loss
        kept = model(**batch, skip_logits=False)
        assert kept.logits is not None
        torch.testing.assert_close(kept.loss, expected)
        skipped = model(**batch, skip_logits=True)
        assert skipped.logits is None
        torch.testing.assert_close(skipped.loss, expected)
        with pytest.raises(ValueError, match="needs labels"):
            model(**no_labels, skip_logits=True)
        model.eval(), reference.eval()
        torch.testing.assert_close(model(**batch).logits, reference(**batch).logits)


def test_llama_with_flce_off_installs_the_forward_and_honours_skip_logits():
    reference, model = tiny_model("llama"), tiny_model("llama")
    with liger_registry.patched(model, fused_linear_cross_entropy=False) as handle:
        assert handle.report.counts()["forward"] == 2  # the head, and the base model's default positions
        assert "fused_linear_cross_entropy" in handle.report.skipped
        _check_contract(model, reference, tiny_batch(model))


@pytest.mark.parametrize("off_by", ["override", "policy"])
def test_labels_mode_drops_the_logits_with_flce_off_too(off_by, tmp_path):
    """Only an explicit skip_logits=True or a `labels` default drops the logits of a forward that does not fuse."""
    reference, model = tiny_model("llama"), tiny_model("llama")
    batch = tiny_batch(model)
    policy = tmp_path / "off.yaml"
    policy.write_text("policy: logits\napplies_to: [llama]\nreason: with logits\nflce: {enabled: false}\n")
    flce_off = {"fused_linear_cross_entropy": False} if off_by == "override" else {"policy": str(policy)}
    with liger_registry.patched(model, skip_logits="labels", **flce_off), torch.no_grad():
        model.train(), reference.train()
        out = model(**batch)
        assert out.logits is None
        torch.testing.assert_close(out.loss, reference(**batch).loss)


def test_llama4_head_gets_the_original_head_forward(monkeypatch):
    # transformers 5.24's Llama4ForConditionalGeneration.forward reads `image_outputs` from its language model's
    # output, which lacks it (the family's known_broken entry); give that output the field, as 5.17 did not need.
    monkeypatch.setattr(modeling_outputs.MoeCausalLMOutputWithPast, "image_outputs", None, raising=False)
    monkeypatch.setattr(modeling_outputs.CausalLMOutputWithPast, "image_outputs", None, raising=False)
    reference, model = tiny_model("llama4"), tiny_model("llama4")
    original = type(model).forward
    with liger_registry.patched(model) as handle:
        assert handle.report.counts()["forward"] == 1
        assert "skip_logits" in inspect.signature(model.forward).parameters
        _check_contract(model, reference, tiny_batch(model))
        out = model(**tiny_batch(model), skip_logits=True, return_dict=False)
        assert isinstance(out, tuple) and out[0].dim() == 0
    assert type(model).forward is original


def test_llama4_is_declared_broken_on_5_24():
    entry = liger_registry.load_registry().family("llama4").entry
    assert "image_outputs" in entry.broken_on("5.24.0") and entry.broken_on("5.17.1") is None


def test_a_forward_that_never_fuses_needs_flce_off(tmp_path):
    (tmp_path / "x.yaml").write_text(
        "family: x\nmodel_types: [x]\nmodule: transformers.models.llama.modeling_llama\n"
        "causal_lm: LlamaForCausalLM\nforward: original_head\n"
    )
    registry = liger_registry.load_registry(tmp_path)
    model = tiny_model("llama")
    model.config.model_type = "x"
    with pytest.raises(liger_registry.PatchError, match="never fuses the loss; set flce.enabled: false"):
        liger_registry.apply(model, registry=registry)
    with liger_registry.patched(model, registry=registry, fused_linear_cross_entropy=False) as handle:
        assert handle.report.counts()["forward"] == 1
