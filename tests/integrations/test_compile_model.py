"""torch.compile of a patched model: same loss and gradients as eager, no graph break the unpatched lacks."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model


def loss_and_grads(call, model, batch):
    model.zero_grad()
    loss = call(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def breaks(model, batch) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**batch)
    return explained.graph_break_count, [str(r.reason) for r in explained.break_reasons]


@pytest.mark.parametrize("training", [True, False], ids=["train-flce", "eval-logits"])
def test_no_graph_break_that_unpatched_has_not(training):
    model = tiny_model("llama")
    batch = tiny_batch(model)
    model.train(training)
    reference, _ = breaks(model, batch)
    with L.patched(model):
        count, reasons = breaks(model, batch)
    assert count <= reference, reasons


def test_compiled_patched_model_matches_eager():
    model = tiny_model("llama")
    batch = tiny_batch(model)
    batch["labels"][:, :4] = -100
    model.train()
    with L.patched(model):
        eager = loss_and_grads(model, model, batch)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert L.patch_handle(compiled) is L.patch_handle(model)  # apply/revert see through the wrapper
        got = loss_and_grads(compiled, model, batch)
    torch.testing.assert_close(got[0], eager[0])
    assert got[1].keys() == eager[1].keys()
    for name, grad in eager[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_regionally_compiled_layers_match_eager():
    """The recipe the README advises: each decoder layer compiled in place, fullgraph, the embeddings and the
    fused head eager; same loss and gradients as eager. Dynamo with its eager backend: AOT and inductor over
    the same ops are the whole-model tests' (here and in test_compile_families)."""
    model = tiny_model("llama")
    batch = tiny_batch(model)
    model.train()
    with L.patched(model):
        eager = loss_and_grads(model, model, batch)
        torch._dynamo.reset()
        counter = CompileCounter()  # dynamo's eager backend, counting the graphs it is handed
        for layer in model.model.layers:
            layer.compile(backend=counter, fullgraph=True)
        got = loss_and_grads(model, model, batch)
        assert counter.frame_count >= 1  # the layers ran compiled
    torch.testing.assert_close(got[0], eager[0])
    assert got[1].keys() == eager[1].keys()
    for name, grad in eager[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_apply_on_a_compiled_model_patches_the_inner_model():
    model = tiny_model("llama")
    compiled = torch.compile(model, backend="eager")
    with L.patched(compiled) as handle:
        assert handle.report.family == "llama" and "forward" in vars(model)
    assert "forward" not in vars(model)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="inductor on the GPU: Triton kernels inside the graph"
)
def test_inductor_on_the_gpu_matches_eager():
    model = tiny_model("llama", hidden_size=128, intermediate_size=256, head_dim=32).cuda()
    batch = {k: v.cuda() for k, v in tiny_batch(model, batch=2, seq=64).items()}
    model.train()
    with L.patched(model):
        eager = loss_and_grads(model, model, batch)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(**batch)
        assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
        torch._dynamo.reset()
        got = loss_and_grads(torch.compile(model), model, batch)
    torch.testing.assert_close(got[0], eager[0], rtol=1e-4, atol=1e-5)
    for name, grad in eager[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-3, atol=1e-5, msg=name)
