"""Where the patched forward differs from the unpatched one on purpose (README "Semantics"), pinned against it."""

from __future__ import annotations

import pytest
import torch

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model

pytestmark = pytest.mark.reliability("silent_wrong")


@pytest.fixture
def llama():
    model = tiny_model("llama")
    model.train()
    return model


def test_all_labels_ignored_is_zero_loss_with_zero_gradients(cases, llama):
    batch = tiny_batch(llama)
    batch["labels"][:] = -100
    assert torch.isnan(llama(**batch).loss)  # unpatched: 0 / 0
    with L.patched(llama):
        loss = llama(**batch).loss
        loss.backward()
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(p.grad) == 0 for p in llama.parameters() if p.grad is not None)
    cases.tried(1)


def test_shift_labels_alone_give_the_loss_of_the_labels(cases, llama):
    batch = tiny_batch(llama)
    labels = batch.pop("labels")
    reference = llama(**batch, labels=labels).loss
    shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    assert llama(**batch, shift_labels=shift_labels).loss is None  # unpatched: no labels, no loss
    with L.patched(llama):
        fused = llama(**batch, shift_labels=shift_labels).loss
        with_logits = llama(**batch, shift_labels=shift_labels, skip_logits=False).loss
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(with_logits, reference, rtol=1e-5, atol=1e-6)
    cases.tried(2)


@pytest.mark.parametrize("use_cache", [False, True])
def test_tuple_output_keeps_positions_without_logits(cases, llama, use_cache):
    batch = tiny_batch(llama)
    unpatched = llama(**batch, return_dict=False, use_cache=use_cache)
    with L.patched(llama):
        out = llama(**batch, return_dict=False, use_cache=use_cache)
        with_logits = llama(**batch, return_dict=False, use_cache=use_cache, skip_logits=False)
    assert len(out) == len(unpatched) == len(with_logits)
    assert out[1] is None  # where the logits were: never the cache
    torch.testing.assert_close(out[0], unpatched[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(with_logits[1], unpatched[1], rtol=1e-5, atol=1e-5)
    assert [type(v) for v in out[2:]] == [type(v) for v in unpatched[2:]]
    cases.tried(2)


def test_float64_model_loss_dtype_and_value_as_unpatched(cases):
    """transformers' loss upcasts logits with .float(), so a float64 model's loss is float32 unpatched too: the
    fused loss has the same dtype and value, and the gradients come back in float64."""
    model = tiny_model("llama", dtype=torch.float64)
    model.train()
    batch = tiny_batch(model)
    reference = model(**batch).loss
    with L.patched(model):
        fused = model(**batch).loss
        fused.backward()
    assert fused.dtype == reference.dtype
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
    assert all(p.grad.dtype == torch.float64 for p in model.parameters() if p.grad is not None)
    cases.tried(1)
