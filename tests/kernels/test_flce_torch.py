"""FLCE (PyTorch path) against materialised logits + F.cross_entropy, forward and backward; chunk geometry."""

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import flce_reference

from liger_registry import kernels as K
from liger_registry.kernels import flce_chunk_geometry
from liger_registry.kernels.flce import plan as flce_planner

STRATEGIES = ["tokens", "vocab"]


@pytest.fixture(autouse=True)
def _small_vocab_chunks(monkeypatch):
    monkeypatch.setattr(flce_planner, "VOCAB_ALIGN", 8)  # V=50 splits into several vocabulary chunks


def _inputs(n=37, h=16, v=50, dtype=torch.float32, bias=False, seed=0, ignore_frac=0.2):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float32).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).to(dtype).requires_grad_()
    target = torch.randint(0, v, (n,), generator=g)
    target[torch.rand(n, generator=g) < ignore_frac] = -100
    b = (torch.randn(v, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    return hidden, weight, target, b


def _grads(loss, tensors, go=None):
    tensors = [t for t in tensors if t is not None]
    return torch.autograd.grad(loss, tensors, grad_outputs=go)


def test_geometry_anchors():
    assert flce_chunk_geometry(8192, 4096, 128256, 1) == (256, 32)
    assert flce_chunk_geometry(8192, 4096, 128256, 8) == (2048, 4)
    assert flce_chunk_geometry(8192, 4096, 128256, 16) == (4096, 2)
    assert flce_chunk_geometry(8192, 4096, 128256, 2) == (512, 16)
    assert flce_chunk_geometry(1, 4096, 128256, 1) == (1, 1)
    assert flce_chunk_geometry(37, 16, 50, 1) == (16, 3)


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.5, "2", None])
def test_geometry_rejects_bad_constant(bad):
    with pytest.raises(ValueError, match="chunk_mem_const"):
        flce_chunk_geometry(8192, 4096, 128256, bad)
    if bad is None:  # None means "not set" in the options (C=1 unless max_chunk_mib is set)
        return
    h, w, t, _ = _inputs()
    with pytest.raises(ValueError, match="chunk_mem_const"):
        K.fused_linear_cross_entropy(h, w, t, chunk_mem_const=bad)
    with pytest.raises(ValueError, match="chunk_mem_const"):
        K.FlceOptions(chunk_mem_const=bad)


OPTIONS = [
    {},
    {"label_smoothing": 0.1},
    {"softcap": 3.0},
    {"logit_scale": 0.25},
    {"lse_square_scale": 1e-2},
    {"class_weights": "w"},
    {"class_weights": "w", "label_smoothing": 0.2},
    {"ignore_index": 3},
    {"softcap": 2.0, "logit_scale": 0.5, "lse_square_scale": 1e-3, "label_smoothing": 0.05},
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("bias", [False, True])
def test_flce_matches_reference(opts, reduction, bias, strategy):
    hidden, weight, target, b = _inputs(bias=bias)
    opts = dict(opts, strategy=strategy)
    opts = dict(opts)
    if opts.get("class_weights") == "w":
        opts["class_weights"] = torch.rand(weight.shape[0], generator=torch.Generator().manual_seed(1)) + 0.5
    if "ignore_index" in opts:
        target = torch.where(target == -100, torch.full_like(target, opts["ignore_index"]), target)
    loss = K.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction, **opts)
    del opts["strategy"]
    ref, _ = flce_reference(hidden, weight, target, b, reduction=reduction, **opts)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    go = torch.randn_like(ref) if reduction == "none" else torch.tensor(1.7)
    got = _grads(loss, [hidden, weight, b], go)
    exp = _grads(ref, [hidden, weight, b], go)
    for a, e in zip(got, exp, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("c", [1, 2, 4, 100])
def test_chunk_constant_does_not_change_result(c, strategy):
    hidden, weight, target, _ = _inputs(n=70)
    loss = K.fused_linear_cross_entropy(hidden, weight, target, chunk_mem_const=c, strategy=strategy)
    ref, _ = flce_reference(hidden, weight, target)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    gh, gw = _grads(loss, [hidden, weight])
    rh, rw = _grads(ref, [hidden, weight])
    torch.testing.assert_close(gh, rh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, rw, rtol=1e-5, atol=1e-6)


def test_flce_never_materialises_full_logits(monkeypatch):
    hidden, weight, target, _ = _inputs(n=64, h=16, v=50)
    seen = []
    real = torch.empty

    def spy(*shape, **kw):
        seen.append(tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape)
        return real(*shape, **kw)

    monkeypatch.setattr(torch, "empty", spy)
    K.fused_linear_cross_entropy(hidden, weight, target, strategy="tokens").backward()
    chunk, _ = flce_chunk_geometry(64, 16, 50)
    assert chunk < 64
    assert (chunk, 50) in seen and (64, 50) not in seen
    seen.clear()
    K.fused_linear_cross_entropy(hidden, weight, target, strategy="vocab").backward()
    plan = K.flce_plan(64, 16, 50, strategy="vocab", dtype=torch.float32)
    assert plan.strategy == "vocab" and plan.num_chunks > 1
    assert (64 * plan.chunk_vocab,) in seen and (64, 50) not in seen and (64 * 50,) not in seen


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_gives_zero_loss_and_grads(reduction):
    hidden, weight, target, b = _inputs(bias=True)
    target = torch.full_like(target, -100)
    out = K.fused_linear_cross_entropy(
        hidden,
        weight,
        target,
        b,
        reduction=reduction,
        lse_square_scale=1e-2,
        return_z_loss=True,
        return_token_accuracy=True,
    )
    assert torch.isfinite(out.loss).all() and (out.loss == 0).all()
    assert (out.z_loss == 0).all() and out.token_accuracy == 0
    out.loss.sum().backward()
    for t in (hidden, weight, b):
        assert torch.isfinite(t.grad).all() and (t.grad == 0).all()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_return_fields(strategy):
    hidden, weight, target, _ = _inputs()
    out = K.fused_linear_cross_entropy(
        hidden, weight, target, lse_square_scale=1e-2, return_z_loss=True, strategy=strategy
    )
    assert isinstance(out, K.FLCEOutput) and out.token_accuracy is None and out.predicted_tokens is None
    _, zref = flce_reference(hidden, weight, target, lse_square_scale=1e-2)
    torch.testing.assert_close(out.z_loss, zref)
    out = K.fused_linear_cross_entropy(
        hidden, weight, target, return_token_accuracy=True, return_predicted_tokens=True, strategy=strategy
    )
    assert out.z_loss is None
    logits = hidden @ weight.t()
    valid = target != -100
    pred = torch.where(valid, logits.argmax(-1), -1)  # the reference library's -1 on ignored rows
    assert torch.equal(out.predicted_tokens, pred)
    torch.testing.assert_close(out.token_accuracy, (pred == target)[valid].float().mean())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accum_dtype_and_low_precision_grads(strategy):
    hidden, weight, target, _ = _inputs(dtype=torch.bfloat16)
    loss = K.fused_linear_cross_entropy(hidden, weight, target, accum_dtype=torch.float32, strategy=strategy)
    gh, gw = _grads(loss, [hidden, weight])
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16 and loss.dtype == torch.float32
    h32 = hidden.detach().float().requires_grad_()
    w32 = weight.detach().float().requires_grad_()
    ref, _ = flce_reference(h32, w32, target)
    rh, rw = _grads(ref, [h32, w32])
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gw.float(), rw, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(gh.float(), rh, rtol=5e-2, atol=5e-3)


def test_input_checks():
    hidden, weight, target, _ = _inputs()
    with pytest.raises(ValueError, match="reduction"):
        K.fused_linear_cross_entropy(hidden, weight, target, reduction="avg")
    with pytest.raises(ValueError, match="target"):
        K.fused_linear_cross_entropy(hidden, weight, target[:-1])
    with pytest.raises(ValueError, match="hidden"):
        K.fused_linear_cross_entropy(hidden, weight[:, :-1], target)
    with pytest.raises(ValueError, match="label_smoothing"):
        K.fused_linear_cross_entropy(hidden, weight, target, label_smoothing=2.0)


def test_vocab_strategy_mixed_dtypes_and_non_contiguous_hidden():
    big = torch.randn(37, 32, generator=torch.Generator().manual_seed(3))
    hidden = big[:, ::2].detach().requires_grad_()
    _, w, target, _ = _inputs()
    weight = w.detach().double().float().requires_grad_()
    for strategy in STRATEGIES:
        loss = K.fused_linear_cross_entropy(hidden, weight, target, strategy=strategy, reduction="sum")
        ref, _ = flce_reference(hidden, weight, target, reduction="sum")
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
        for a, e in zip(_grads(loss, [hidden, weight]), _grads(ref, [hidden, weight]), strict=True):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_accumulation_fallback(dtype):
    from liger_registry.kernels.flce.vocab import accumulate_fp32

    g = torch.Generator().manual_seed(0)
    a = torch.randn(9, 20, generator=g).to(dtype)
    b = torch.randn(20, 7, generator=g).to(dtype)
    acc = torch.full((9, 7), float("nan"))
    accumulate_fp32(acc, a, b, first=True, out_dtype_ok=False)  # beta=0: the uninitialised buffer is ignored
    accumulate_fp32(acc, a, b, first=False, out_dtype_ok=False)
    torch.testing.assert_close(acc, 2 * (a.float() @ b.float()))


def _peaked_bf16(n=256, h=128, v=32000, seed=11):
    """bf16 head inputs whose hidden rows lean on their target's weight row (confident rows, loss ~2)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(v, h, generator=g) * 0.2
    target = torch.randint(0, v, (n,), generator=g)
    hidden = (
        torch.randn(n, h, generator=g) + 0.5 * weight[target] / weight[target].pow(2).mean(-1, True).sqrt()
    )
    return hidden.bfloat16(), weight.bfloat16(), target


@pytest.mark.parametrize("inputs", ["random", "peaked"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_loss_within_1e5_of_float64(inputs, strategy):
    """16-bit logits round the target logit (~1e-4 relative on confident rows); the exact fp32 target logit
    brings the loss within 1e-5 of float64 on the same bf16 inputs."""
    hidden, weight, target = _peaked_bf16()
    if inputs == "random":
        hidden = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(5)).bfloat16()
    target[[3, 17]] = -100
    ref = F.cross_entropy(hidden.double() @ weight.double().t(), target)
    rounded = F.cross_entropy((hidden.float() @ weight.float().t()).bfloat16().double(), target)
    if inputs == "peaked":
        assert abs(rounded / ref - 1) > 2e-5  # what the exact target logit must fix
    out = K.fused_linear_cross_entropy(hidden, weight, target, strategy=strategy, max_chunk_mib=2)
    assert abs(out.double() / ref - 1) < 1e-5, (out.item(), ref.item(), rounded.item())


@pytest.mark.parametrize("bias", [False, True])
def test_vocab_pass_two_reuses_the_last_chunk(monkeypatch, bias):
    """Pass 2 runs the chunks in reverse and starts from the logits pass 1 left in the buffer: 2k - 1 logits
    GEMMs for k chunks (k without a gradient), and the same result."""
    from liger_registry.kernels.flce import vocab as flce_vocab

    hidden, weight, target, b = _inputs(n=64, h=16, v=50, bias=bias)
    calls = []
    real = flce_vocab._logits
    monkeypatch.setattr(flce_vocab, "_logits", lambda *a: calls.append(a[1].w.shape[0]) or real(*a))
    k = K.flce_plan(64, 16, 50, strategy="vocab", dtype=torch.float32).num_chunks
    detached = [None if t is None else t.detach() for t in (hidden, weight, b)]
    K.fused_linear_cross_entropy(detached[0], detached[1], target, detached[2], strategy="vocab")
    assert k > 2 and len(calls) == k
    calls.clear()
    loss = K.fused_linear_cross_entropy(hidden, weight, target, b, strategy="vocab")
    got = _grads(loss, [hidden, weight, b])
    assert len(calls) == 2 * k - 1
    ref, _ = flce_reference(hidden, weight, target, b)
    for a, e in zip(got, _grads(ref, [hidden, weight, b]), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
