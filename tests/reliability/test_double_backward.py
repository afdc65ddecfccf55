"""Backward twice, autograd.grad twice and gradient penalties through a patched model: the same gradients as
unpatched, or a clear error that names the option to use."""

from __future__ import annotations

import pytest
import torch

import liger_registry as L
from liger_registry import kernels
from liger_registry.testing import tiny_batch, tiny_model

pytestmark = pytest.mark.reliability("raw_exception")


def twice(model, batch, **call) -> list[dict]:
    """Gradients after one backward and after a second one over the same (retained) graph."""
    model.zero_grad()
    loss = model(**batch, **call).loss
    grads = []
    for _ in range(2):
        loss.backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return grads


def test_decoder_kernels_backward_twice_as_unpatched(cases):
    """rms_norm, rope and swiglu (the logits path: skip_logits=False) accumulate the same gradients twice."""
    model = tiny_model("llama")
    batch = tiny_batch(model)
    model.train()
    reference = twice(model, batch)
    with L.patched(model):
        got = twice(model, batch, skip_logits=False)
    for want, have in zip(reference, got, strict=True):
        assert want.keys() == have.keys()
        for name in want:
            torch.testing.assert_close(have[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
    cases.tried(2)


@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_flce_second_backward_is_a_clear_error(cases, strategy):
    hidden = torch.randn(12, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(0, 40, (12,))
    loss = kernels.fused_linear_cross_entropy(hidden, weight, target, strategy=strategy)
    (first,) = torch.autograd.grad(loss, hidden, retain_graph=True)
    with pytest.raises(RuntimeError, match="skip_logits=False"):
        torch.autograd.grad(loss, hidden, retain_graph=True)
    loss = kernels.fused_linear_cross_entropy(hidden, weight, target, strategy=strategy)
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(loss, hidden, create_graph=True)
    expected = torch.nn.functional.cross_entropy(hidden @ weight.T, target)
    torch.testing.assert_close(first, torch.autograd.grad(expected, hidden)[0], rtol=1e-5, atol=1e-6)
    cases.tried(3)


@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
def test_flce_reduction_none_backward_twice_as_unpatched(cases, strategy):
    hidden = torch.randn(12, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(0, 40, (12,))
    loss = kernels.fused_linear_cross_entropy(
        hidden, weight, target, strategy=strategy, reduction="none"
    ).sum()
    expected = torch.nn.functional.cross_entropy(hidden @ weight.T, target, reduction="sum")
    want = torch.autograd.grad(expected, hidden)[0]
    for _ in range(2):
        torch.testing.assert_close(
            torch.autograd.grad(loss, hidden, retain_graph=True)[0], want, rtol=1e-5, atol=1e-6
        )
    cases.tried(2)


def test_patched_model_second_backward_names_the_option(cases):
    model = tiny_model("llama")
    batch = tiny_batch(model)
    model.train()
    with L.patched(model):
        loss = model(**batch).loss
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="skip_logits=False"):
            loss.backward()
    cases.tried(1)
