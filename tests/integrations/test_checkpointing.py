"""Gradient checkpointing with patched modules: same loss and gradients as without, patched or not."""

from __future__ import annotations

import pytest
import torch

import liger_registry as L
from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.testing import tiny_batch, tiny_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on CPU (the interpreter) in every run, and on CUDA where the GPU runner selects the gpu marker
pytestmark = pytest.mark.gpu


def loss_and_grads(model, batch):
    model.train()
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


# llama under every (reentrant, backend) pair; each MoE family with both settings and both backends, paired the
# two ways (the experts kernel's saved tensors are the same whichever checkpointing unpacks them)
CASES = [(r, "llama", b) for r in (False, True) for b in ("torch", "triton")] + [
    (False, "qwen3_moe", "triton"),
    (True, "qwen3_moe", "torch"),
    (True, "gpt_oss", "triton"),
    (False, "gpt_oss", "torch"),
]


@pytest.mark.parametrize("reentrant,model_type,backend", CASES)
def test_checkpointed_patched_model_has_the_same_gradients(reentrant, model_type, backend, monkeypatch):
    """Both backends (Triton: what a GPU runs; through the interpreter here): non-reentrant checkpointing unpacks
    each saved tensor once, so a backward may read ``ctx.saved_tensors`` only once. MoE rows: the experts
    kernel's routing table and saved activations are rebuilt in the recomputation."""
    if backend == "triton" and not (DEVICE == "cuda" or triton_utils.INTERPRET_AT_IMPORT):
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, backend)
    model = tiny_model(model_type).to(DEVICE)
    batch = {k: v.to(DEVICE) for k, v in tiny_batch(model).items()}
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
