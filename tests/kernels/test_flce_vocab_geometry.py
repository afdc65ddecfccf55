"""The vocab strategy's chunk geometry: the scratch in dW's memory never overlaps what a pass still needs, the
passes cover every column once, and FLCE through the scratch matches the reference on both backends."""

import pytest
import torch
from kernel_refs import flce_reference

from liger_registry import kernels as K
from liger_registry.kernels import flce_planner, flce_vocab, triton_utils
from liger_registry.kernels.flce_vocab_geometry import VocabChunk, fits, plain_geometry, vocab_geometry

LLAMA, GPT_OSS = (4096, 128256), (2880, 201088)


@pytest.mark.parametrize("n", [1, 7, 300, 2048, 4096, 8192, 16384, 65536])
@pytest.mark.parametrize("shape", [LLAMA, GPT_OSS, (32, 200), (16, 50)])
@pytest.mark.parametrize("width", [8, 128, 3072, 3968, 1 << 20])
def test_scratch_never_overlaps_and_covers_every_column(n, shape, width):
    multiple = 8 if shape[1] < 1000 else 128
    geometry = vocab_geometry(n, *shape, width, True, multiple)
    assert fits(geometry, n, *shape)
    assert geometry.pass2[0].reuse and geometry.pass2[0][:2] == geometry.pass1[-1][:2]
    assert not any(c.reuse for c in geometry.pass2[1:])
    assert geometry.buffer_cols <= max(min(width, shape[1]), 1)
    assert fits(vocab_geometry(n, *shape, width, False, multiple), n, *shape)


def test_llama_2048_layout():
    """Llama-3 at 2048 tokens and the C=1 budget (3968 columns): pass 1 in 2 chunks, pass 2 in 5 — 85504
    columns reused, 28416 and 9472 in the scratch, the last 4864 in two buffer chunks (was 32 + 32 chunks)."""
    g = vocab_geometry(2048, *LLAMA, 3968, True)
    assert g.pass1 == (VocabChunk(0, 42752, True), VocabChunk(42752, 85504, True))
    assert [(c.width, c.scratch, c.reuse) for c in g.pass2] == [
        (85504, True, True),
        (28416, True, False),
        (9472, True, False),
        (2432, False, False),
        (2432, False, False),
    ]
    assert g.buffer_cols == 2432 and g.scratch


def test_plain_geometry_without_a_weight_gradient_or_when_rows_outnumber_the_gain():
    assert vocab_geometry(2048, *LLAMA, 3968, False) == plain_geometry(LLAMA[1], 3968)
    assert not vocab_geometry(1 << 20, *LLAMA, 3968, True).scratch  # V H / (N + H) < the buffer's width
    plain = plain_geometry(50, 16)
    assert [c.width for c in plain.pass1] == [16, 16, 16, 2] and plain.pass2[0] == VocabChunk(
        48, 2, False, True
    )


N, H, V = 24, 32, 200  # C=1 budget: 32 columns; the scratch takes 112 (reused), 48, then 2 x 24 in the buffer


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not (triton_utils.INTERPRET_AT_IMPORT or torch.cuda.is_available()):
        pytest.skip("Triton needs the interpreter or CUDA")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    monkeypatch.setattr(flce_planner, "VOCAB_ALIGN", 8)
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 32)
    return request.param


def _inputs(bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.5).requires_grad_()
    target = torch.randint(0, V, (N,), generator=g)
    target[::5] = -100
    b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if bias else None
    return hidden, weight, target, b


def test_the_case_exercises_every_kind_of_chunk(backend):
    plan = K.flce_plan(N, H, V, strategy="vocab", dtype=torch.float32)
    g = vocab_geometry(N, H, V, plan.chunk_vocab, True, 8)
    kinds = {(c.scratch, c.reuse) for c in g.pass2}
    assert plan.scratch and kinds == {(True, True), (True, False), (False, False)}, g


@pytest.mark.parametrize(
    "opts",
    [{}, {"label_smoothing": 0.1}, {"softcap": 3.0}, {"reduction": "sum"}, {"reduction": "none"}],
    ids=str,
)
@pytest.mark.parametrize("bias", [False, True])
def test_scratch_matches_the_reference(backend, opts, bias):
    hidden, weight, target, b = _inputs(bias)
    tensors = [t for t in (hidden, weight, b) if t is not None]
    out = K.fused_linear_cross_entropy(hidden, weight, target, b, strategy="vocab", **opts)
    ref, _ = flce_reference(hidden, weight, target, b, **opts)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    go = torch.rand_like(out) if out.dim() else None
    got = torch.autograd.grad(out, tensors, grad_outputs=go)
    want = torch.autograd.grad(ref, tensors, grad_outputs=go)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_frozen_head_takes_the_plain_geometry_and_is_right(backend, monkeypatch):
    seen = []
    real = flce_vocab.vocab_geometry
    monkeypatch.setattr(
        flce_vocab, "vocab_geometry", lambda *a, **k: seen.append(k["scratch"]) or real(*a, **k)
    )
    hidden, weight, target, _ = _inputs(False)
    weight = weight.detach()
    out = K.fused_linear_cross_entropy(hidden, weight, target, strategy="vocab")
    (dh,) = torch.autograd.grad(out, hidden)
    ref, _ = flce_reference(hidden, weight, target, None)
    (rdh,) = torch.autograd.grad(ref, hidden)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dh, rdh, rtol=1e-4, atol=1e-5)
    assert seen == [False]


def test_logits_gemms_and_buffer(backend, monkeypatch):
    """One logits GEMM per pass-1 chunk and per pass-2 chunk but the reused one; the budget buffer allocated is
    only as wide as the widest chunk that does not fit in the scratch."""
    hidden, weight, target, _ = _inputs(False)
    calls, sizes = [], []
    real_logits, real_empty = flce_vocab._logits, torch.empty
    monkeypatch.setattr(flce_vocab, "_logits", lambda *a: calls.append(a[1].w.shape[0]) or real_logits(*a))
    monkeypatch.setattr(
        torch, "empty", lambda *s, **k: sizes.append(s[0] if len(s) == 1 else s) or real_empty(*s, **k)
    )
    out = K.fused_linear_cross_entropy(hidden, weight, target, strategy="vocab")
    monkeypatch.setattr(torch, "empty", real_empty)
    plan = K.flce_plan(N, H, V, strategy="vocab", dtype=torch.float32)
    g = vocab_geometry(N, H, V, plan.chunk_vocab, True, 8)
    assert calls == [c.width for c in g.pass1] + [c.width for c in g.pass2 if not c.reuse]
    assert N * g.buffer_cols in sizes and N * plan.chunk_vocab not in sizes
    torch.autograd.grad(out, [hidden, weight])
