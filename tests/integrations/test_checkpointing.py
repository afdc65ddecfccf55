"""Gradient checkpointing with patched modules: same loss and gradients as without, patched or not."""

from __future__ import annotations

import pytest
import torch

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model


def loss_and_grads(model, batch):
    model.train()
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_patched_model_has_the_same_gradients(reentrant, model_type):
    """MoE rows: the experts kernel's routing table and saved activations are rebuilt in the recomputation."""
    model = tiny_model(model_type)
    batch = tiny_batch(model)
    reference = loss_and_grads(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert model.is_gradient_checkpointing
    with L.patched(model):
        calls = []
        norm = model.model.layers[0].input_layernorm
        hook = norm.register_forward_hook(lambda *_: calls.append(1))
        got = loss_and_grads(model, batch)
        hook.remove()
    assert len(calls) == 2, "the checkpointed layer runs its patched norm again in the backward"
    torch.testing.assert_close(got[0], reference[0])
    for name, grad in reference[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)
