"""cross_entropy=True: the forward computes the loss of its materialised logits with our cross-entropy kernel, with
transformers' shift, ignore_index and num_items_in_batch semantics, per model (no module-wide patch)."""

from __future__ import annotations

import pytest
import torch
from transformers import modeling_outputs
from transformers.loss import loss_utils

import liger_registry as L
from liger_registry import kernels
from liger_registry.testing import tiny_batch, tiny_model

# dense, final-logit softcap, MoE, the original_head forward (llama4's multimodal head)
FAMILIES = ["llama", "gemma2", "qwen3_moe", "llama4"]


@pytest.fixture
def ce_calls(monkeypatch):
    calls = []
    real = kernels.cross_entropy

    def spy(*args, **kwargs):
        calls.append(args[0].dtype)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "cross_entropy", spy)
    # transformers 5.24's Llama4ForConditionalGeneration reads `image_outputs` from its language model's output
    monkeypatch.setattr(modeling_outputs.MoeCausalLMOutputWithPast, "image_outputs", None, raising=False)
    monkeypatch.setattr(modeling_outputs.CausalLMOutputWithPast, "image_outputs", None, raising=False)
    return calls


def _batch(model, ignore_index: int = -100) -> dict:
    batch = tiny_batch(model)
    batch["labels"][0, :5] = ignore_index
    batch["labels"][1, -3:] = ignore_index
    return batch


def _loss_and_grads(model, batch: dict, **kwargs):
    model.zero_grad()
    out = model(**batch, **kwargs)
    out.loss.backward()
    head = model.get_output_embeddings().weight
    return out, head.grad.clone()


@pytest.mark.parametrize("num_items", [None, 37])
@pytest.mark.parametrize("family", FAMILIES)
def test_cross_entropy_with_logits_matches_unpatched(family, num_items, ce_calls):
    """The reference library's with-logits setting: fused_linear_cross_entropy=False, cross_entropy=True."""
    reference, model = tiny_model(family).train(), tiny_model(family).train()
    batch = _batch(model)
    extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    expected, expected_grad = _loss_and_grads(reference, batch, **extra)
    with L.patched(model, fused_linear_cross_entropy=False, cross_entropy=True) as handle:
        assert "cross_entropy" in handle.report.loss_line()
        got, grad = _loss_and_grads(model, batch, **extra)
        assert ce_calls == [torch.float32]  # fp32 logits, as transformers' loss upcasts them
        torch.testing.assert_close(got.logits, expected.logits)
        torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)
        skipped = model(**batch, **extra, skip_logits=True)
        assert skipped.logits is None
        torch.testing.assert_close(skipped.loss, expected.loss, rtol=1e-5, atol=1e-6)
    assert loss_utils.fixed_cross_entropy.__module__ == "transformers.loss.loss_utils"


def test_custom_ignore_index_and_the_shift(ce_calls):
    reference, model = tiny_model("llama").eval(), tiny_model("llama").eval()
    batch = _batch(model, ignore_index=-1)
    with torch.no_grad():
        expected = reference(**batch, ignore_index=-1).loss
        with L.patched(model, cross_entropy=True):
            got = model(**batch, ignore_index=-1).loss
    assert ce_calls, "the cross-entropy kernel was not used"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_with_flce_on_the_logits_path_uses_it_and_training_stays_fused(ce_calls):
    reference, model = tiny_model("llama"), tiny_model("llama")
    batch = _batch(model)
    with torch.no_grad(), L.patched(model, cross_entropy=True):
        model.eval(), reference.eval()
        torch.testing.assert_close(model(**batch).loss, reference(**batch).loss, rtol=1e-5, atol=1e-6)
        assert len(ce_calls) == 1
        model.train(), reference.train()
        out = model(**batch)
        assert out.logits is None and len(ce_calls) == 1  # FLCE: no logits, no cross entropy of them
        torch.testing.assert_close(out.loss, reference(**batch).loss, rtol=1e-5, atol=1e-6)


def test_off_by_default_and_per_model(ce_calls):
    """Off by default (transformers' loss); on, only the patched model uses the kernel: no module-wide patch."""
    model, twin = tiny_model("llama").eval(), tiny_model("llama").eval()
    batch = _batch(model)
    with torch.no_grad():
        with L.patched(model):
            model(**batch)
        assert ce_calls == []
        with L.patched(model, cross_entropy=True):
            model(**batch)
            twin(**batch)
        assert len(ce_calls) == 1
