"""The RL head (``kernels.fused_linear_logprobs``): every output and the gradients of log-probs and entropy against
full fp32 logits and against TRL's fused head, on both backends (Triton through the interpreter, blocks lowered so
tiny rows cross column blocks), over tile plans, layouts, temperature, softcap and scale; sm_90 compilation of its
kernels; bf16 on the GPU."""

from __future__ import annotations

import pytest
import torch
from cases import INTERPRETER, NO_INTERPRETER

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.rl_head import OUTPUTS, fused_linear_logprobs, tile_plan
from liger_registry.kernels.rl_head import triton_kernels as rl_triton
from liger_registry.kernels.rl_head.reference import logit_stats, rl_head_reference

N, H, V = 9, 16, 200
TRANSFORMS = {
    "plain": {},
    "temperature": {"temperature": 0.7},
    "softcap-scale": {"temperature": 1.3, "softcap": 4.0, "logit_scale": 0.5},
}
TINY_TILE = 128 * 4 * 4 / 2**20  # 4 tokens x 128 columns of fp32: tokens and vocabulary both split


@pytest.fixture(params=["torch", "triton"])
def rl_backend(request, monkeypatch):
    if request.param == "triton":
        if not INTERPRETER:
            pytest.skip(NO_INTERPRETER)
        monkeypatch.setattr(triton_utils, "MAX_BLOCK", 32)
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _inputs(bias=True, layout="contiguous", n=N, v=V, seed=0):
    h = torch.randn(n, 2 * H if layout == "strided-rows" else H, generator=_g(seed))[:, :H]
    w = torch.randn(H, v, generator=_g(seed + 1)).t() if layout == "transposed-weight" else None
    w = torch.randn(v, H, generator=_g(seed + 1)) if w is None else w
    b = torch.randn(v, generator=_g(seed + 2)) if bias else None
    t = torch.randint(0, v, (n,), generator=_g(seed + 3))
    t[0], t[-1] = 0, v - 1  # the first and the last column of the vocabulary
    leaves = [x.detach().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    return (*leaves, *(() if bias else (None,)), t)


def rel_err(a: torch.Tensor, r: torch.Tensor) -> float:
    return ((a.double() - r.double()).norm() / r.double().norm().clamp(min=1e-30)).item()


def _loss(lp, ent):
    """A loss weighting each token differently, so that per-token gradient mistakes show."""
    w = torch.linspace(-1.0, 2.0, lp.shape[0], device=lp.device)
    return (lp * w).sum() + (0.0 if ent is None else (ent * w.flip(0)).sum())


def _grads(out_lp, out_ent, leaves):
    leaves = [x for x in leaves if x is not None]
    return torch.autograd.grad(_loss(out_lp, out_ent), leaves)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("tile", ["one-tile", "split"])
@pytest.mark.parametrize("layout", ["contiguous", "strided-rows", "transposed-weight"])
def test_every_output_and_gradient_matches_full_logits(rl_backend, transform, tile, layout):
    h, w, b, t = _inputs(layout=layout)
    kw = TRANSFORMS[transform]
    out = fused_linear_logprobs(
        h, w, t, b, outputs=OUTPUTS, max_tile_mib=TINY_TILE if tile == "split" else None, **kw
    )
    ref = rl_head_reference(h, w, t, b, **kw)
    for name, a, r in zip(OUTPUTS, out, ref, strict=True):
        if name == "is_top1":
            assert torch.equal(a, r), name
        else:
            assert a.dtype == torch.float32 and rel_err(a, r) <= 1e-5, (name, rel_err(a, r))
    for a, r in zip(_grads(out[0], out[1], (h, w, b)), _grads(ref[0], ref[1], (h, w, b)), strict=True):
        assert rel_err(a, r) <= 1e-5


def test_split_tiles_split_both_ways():
    assert tile_plan(N, V, 4, TINY_TILE) == (4, 128)
    assert tile_plan(N, V, 4) == (N, V)  # the default budget holds the whole problem
    assert tile_plan(65536, 151936, 2) == (32768, 8192)


@pytest.mark.parametrize("outputs", [("log_probs",), ("log_probs", "entropy"), ("is_top1", "mean_logits")])
def test_outputs_not_asked_for_are_none_and_the_rest_unchanged(rl_backend, outputs):
    h, w, b, t = _inputs()
    out = fused_linear_logprobs(h, w, t, b, outputs=outputs, max_tile_mib=TINY_TILE)
    full = fused_linear_logprobs(h, w, t, b, outputs=OUTPUTS, max_tile_mib=TINY_TILE)
    for name, a, f in zip(OUTPUTS, out, full, strict=True):
        if name in outputs or name == "log_probs":
            assert torch.equal(a, f), name
        else:
            assert a is None, name
    ref = rl_head_reference(h, w, t, b)
    (g,) = torch.autograd.grad(out.log_probs.sum(), [h])
    (r,) = torch.autograd.grad(ref[0].sum(), [h])
    assert rel_err(g, r) <= 1e-5


def test_entropy_alone_gets_its_gradient(rl_backend):
    """An upstream gradient on the entropy only (TRL's entropy bonus), and on the log-probs only."""
    h, w, b, t = _inputs()
    out = fused_linear_logprobs(h, w, t, b, max_tile_mib=TINY_TILE)
    ref = rl_head_reference(h, w, t, b)
    for pick in (1, 0):
        got = torch.autograd.grad(out[pick].sum(), [h, w, b], retain_graph=True)
        want = torch.autograd.grad(ref[pick].sum(), [h, w, b], retain_graph=True)
        for a, r in zip(got, want, strict=True):
            assert rel_err(a, r) <= 1e-5


def test_is_top1_takes_the_first_maximum_across_tiles(rl_backend):
    """Ties: the target counts only when no earlier column holds the same max (torch.argmax's rule), also when
    the tie sits in an earlier tile or an earlier column block."""
    h = torch.ones(4, H)
    w = torch.zeros(V, H)
    w[[3, 150, 190]] = 1.0  # three columns hold the max; 3 and 150 sit in different 128-column slabs
    t = torch.tensor([3, 150, 190, 4])
    out = fused_linear_logprobs(h, w, t, outputs=("is_top1",), max_tile_mib=TINY_TILE)
    assert out.is_top1.tolist() == [True, False, False, False]


def test_gradient_of_a_frozen_weight_is_not_computed(rl_backend):
    h, w, b, t = _inputs()
    out = fused_linear_logprobs(h, w.detach(), t, b.detach(), max_tile_mib=TINY_TILE)
    (g,) = torch.autograd.grad(_loss(out.log_probs, out.entropy), [h])
    ref = rl_head_reference(h, w, t, b)
    (r,) = torch.autograd.grad(_loss(ref[0], ref[1]), [h])
    assert rel_err(g, r) <= 1e-5


def test_no_tokens(rl_backend):
    h, w, b, _ = _inputs()
    out = fused_linear_logprobs(h[:0], w, torch.zeros(0, dtype=torch.long), b)
    assert out.log_probs.shape == (0,) and out.entropy.shape == (0,)
    _loss(out.log_probs, out.entropy).backward()
    assert torch.count_nonzero(w.grad) == 0


def test_bad_arguments_are_clear_errors():
    h, w, b, t = _inputs()
    with pytest.raises(ValueError, match="unknown outputs"):
        fused_linear_logprobs(h, w, t, outputs=("log_probs", "logits"))
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_logprobs(h, w, t, temperature=0.0)
    with pytest.raises(ValueError, match="weight"):
        fused_linear_logprobs(h, w[:, :4], t)
    with pytest.raises(ValueError, match="target"):
        fused_linear_logprobs(h, w, t.float())


def test_compiles_without_graph_break(rl_backend):
    """One custom op in the graph (fullgraph): the compiled outputs and gradients are the eager ones."""
    h, w, b, t = _inputs()

    def run(h, w, b, t):
        out = fused_linear_logprobs(h, w, t, b, outputs=OUTPUTS, max_tile_mib=TINY_TILE, softcap=3.0)
        return _loss(out.log_probs, out.entropy), out.is_top1

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    (loss, top1), (want, want_top1) = compiled(h, w, b, t), run(h, w, b, t)
    assert rel_err(loss, want) <= 1e-6 and torch.equal(top1, want_top1)
    got = torch.autograd.grad(loss, [h, w, b])
    for a, r in zip(got, torch.autograd.grad(want, [h, w, b]), strict=True):
        assert rel_err(a, r) <= 1e-6


# ---------------------------------------------------------------- against TRL's fused head
def _trl_head(h, w, b, t, kw, outputs, chunk):
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    temperature = kw.get("temperature", 1.0)
    return ChunkedLogProbFunction.apply(
        h, w, b, t, temperature, chunk, kw.get("softcap"), kw.get("logit_scale", 1.0), outputs
    )


@pytest.fixture(params=["trl-torch", "trl-triton"])
def trl_path(request, monkeypatch):
    """TRL's head as it runs on CPU (its PyTorch tiles), and its Triton kernels through the interpreter."""
    pytest.importorskip("trl")
    from trl.kernels import chunked_logprob

    if request.param == "trl-triton":
        if not INTERPRETER:
            pytest.skip(NO_INTERPRETER)
        monkeypatch.setattr(chunked_logprob, "_use_triton", lambda device: True)
        monkeypatch.setattr(chunked_logprob, "_BLOCK_SIZE", 32)
    return request.param


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_matches_trl_fused_head(rl_backend, trl_path, transform):
    h, w, b, t = _inputs()
    kw = TRANSFORMS[transform]
    ours = fused_linear_logprobs(h, w, t, b, outputs=OUTPUTS, max_tile_mib=TINY_TILE, **kw)
    trl = _trl_head(h, w, b, t, kw, OUTPUTS, chunk=64)
    for name, a, r in zip(OUTPUTS, ours, trl, strict=True):
        if name == "is_top1":
            assert torch.equal(a, r)
        else:
            assert rel_err(a, r) <= 1e-5, (name, rel_err(a, r))
    for a, r in zip(_grads(ours[0], ours[1], (h, w, b)), _grads(trl[0], trl[1], (h, w, b)), strict=True):
        assert rel_err(a, r) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_16_bit_tiles_take_the_exact_target_logit(rl_backend, dtype, transform):
    """Confident rows in 16 bits: the tile rounds the target's logit, ours replaces it with the exact fp32 one,
    so every output is about as close to float64 as TRL's head or closer, bf16 log-probs clearly closer;
    the gradients keep the tile's own log Z (probabilities that sum to one)."""
    pytest.importorskip("trl")  # its PyTorch tiles: the 16-bit peer
    g = _g(5)
    w = 0.3 * torch.randn(500, 64, generator=g)
    t = torch.randint(0, 500, (24,), generator=g)
    h = (torch.randn(24, 64, generator=g) + 1.5 * w[t]).to(dtype).requires_grad_()
    w = w.to(dtype).requires_grad_()
    kw = TRANSFORMS[transform]
    truth = rl_head_reference(h.double(), w.double(), t, **kw)
    ours = fused_linear_logprobs(h, w, t, outputs=OUTPUTS, max_tile_mib=TINY_TILE, **kw)
    trl = _trl_head(h, w, None, t, kw, OUTPUTS, chunk=128)
    errs = {
        name: (rel_err(ours[i], truth[i]), rel_err(trl[i], truth[i])) for i, name in enumerate(OUTPUTS[:4])
    }
    assert all(e_ours <= 1.05 * e_trl for e_ours, e_trl in errs.values()), errs
    closer = 0.8 if dtype == torch.bfloat16 else 1.05  # fp16 rounds the target's logit 8x less than bf16
    assert errs["log_probs"][0] <= closer * errs["log_probs"][1], errs
    assert torch.equal(ours.is_top1, trl[4])
    want = _grads(truth[0], truth[1], (h, w))
    for a, r, g in zip(_grads(ours[0], ours[1], (h, w)), _grads(trl[0], trl[1], (h, w)), want, strict=True):
        assert rel_err(a, g) <= 1.5 * rel_err(r, g) + 1e-3


# ---------------------------------------------------------------- the kernels compile for sm_90
@pytest.mark.skipif(not INTERPRETER, reason=NO_INTERPRETER)
def test_kernels_compile_for_sm90_without_spills(monkeypatch):
    from sm90_compile import compile_for_sm90, distinct, record_launches

    monkeypatch.setenv(K.ENV_VAR, "triton")
    v = 5000  # wider than both blocks: the launches of a real vocabulary
    h = torch.randn(3, 32, generator=_g(0), requires_grad=True)
    w = torch.randn(v, 32, generator=_g(1), requires_grad=True)
    t = torch.randint(0, v, (3,), generator=_g(2))
    with record_launches() as records:
        for kw in ({}, {"softcap": 30.0, "temperature": 0.9}):
            out = fused_linear_logprobs(h, w, t, outputs=OUTPUTS, **kw)
            _loss(out.log_probs, out.entropy).backward()
            out = fused_linear_logprobs(h, w, t, outputs=("log_probs",), **kw)
            out.log_probs.sum().backward()
    kernels = {r["kernel"] for r in records}
    assert {"_fold_kernel", "_grad_kernel"} <= kernels
    results = compile_for_sm90(records)
    assert len(results) == len(distinct(records))
    failed = [f"{r['kernel']}: {r['error']}" for r in results if r["error"]]
    assert not failed, "\n".join(failed)
    spills = [f"{r['kernel']} {r['constexprs']} stack {r['stack']} B" for r in results if r["stack"]]
    assert not spills, spills
    assert rl_triton.FOLD_BLOCK <= 1024  # the block the no-spill check measured at its widest


# ---------------------------------------------------------------- bf16 on the GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_bf16_gpu_parity_with_trl_and_full_logits(transform, monkeypatch):
    """bf16 head (Qwen-like widths): ours is as close to the float64 truth as TRL's head and as bf16 full logits,
    for every output and the gradients."""
    pytest.importorskip("trl")
    monkeypatch.setenv(K.ENV_VAR, "auto")
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    n, hdim, v = 1024, 512, 32000
    kw = TRANSFORMS[transform]
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(n, hdim, device="cuda", generator=gen).bfloat16().requires_grad_()
    w = (0.05 * torch.randn(v, hdim, device="cuda", generator=gen)).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=gen)
    truth = rl_head_reference(h.double(), w.double(), t, **kw)
    g_truth = _grads(truth[0], truth[1], (h, w))
    ours = fused_linear_logprobs(h, w, t, outputs=OUTPUTS, max_tile_mib=16, **kw)
    trl = ChunkedLogProbFunction.apply(
        h,
        w,
        None,
        t,
        kw.get("temperature", 1.0),
        4096,
        kw.get("softcap"),
        kw.get("logit_scale", 1.0),
        OUTPUTS,
    )
    x = (h @ w.t()).float() * kw.get("logit_scale", 1.0)
    if kw.get("softcap"):
        x = kw["softcap"] * torch.tanh(x / kw["softcap"])
    full = logit_stats(x / kw.get("temperature", 1.0), t)  # from the bf16 logits
    for i, name in enumerate(OUTPUTS[:4]):
        e_ours, e_trl, e_full = (rel_err(x[i], truth[i]) for x in (ours, trl, full))
        assert e_ours <= max(2 * min(e_trl, e_full), 2e-3), (name, e_ours, e_trl, e_full)
    assert (ours.is_top1 == trl[4]).float().mean() > 0.99
    for a, r, g in zip(
        _grads(ours[0], ours[1], (h, w)), _grads(trl[0], trl[1], (h, w)), g_truth, strict=True
    ):
        assert rel_err(a, g) <= max(2 * rel_err(r, g), 2e-2)
