"""The vocab strategy of FLCE (kernels/flce): its chunk geometry (the scratch in dW's memory never overlaps what a
pass still needs, the passes cover every column once, N <= H keeps every chunk's logits for pass 2), FLCE
through either layout against the reference on both backends, the vocabulary row kernels and the exact target
logit (Triton through the interpreter on CPU) against the PyTorch rows; on CUDA, the fp32 accumulation paths,
the kept / one-kept / plain layouts' gradients and peaks at the Llama-3 head."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from cases import (
    FlceOptions,
    ce_ref,
    ce_triton,
    close,
    flce_plan,
    flce_ref,
    flce_reference,
    flce_triton,
    flce_vocab,
    g,
    gpu,
    leaf,
    llama_head,
    rel,
    target_logits_torch,
    target_logits_triton,
    tied_rows,
    triton_utils,
)

from liger_registry import kernels as K

KEPT_MAX_CHUNKS = flce_plan.KEPT_MAX_CHUNKS
VocabChunk = flce_plan.VocabChunk
fits = flce_plan.fits
kept_geometry = flce_plan.kept_geometry
plain_geometry = flce_plan.plain_geometry
vocab_geometry = flce_plan.vocab_geometry

LLAMA, GPT_OSS = (4096, 128256), (2880, 201088)


@pytest.mark.parametrize("n", [1, 7, 300, 2048, 4096, 8192, 16384, 65536])
@pytest.mark.parametrize("shape", [LLAMA, GPT_OSS, (32, 200), (16, 50)])
@pytest.mark.parametrize("width", [8, 128, 3072, 3968, 1 << 20])
def test_scratch_never_overlaps_and_covers_every_column(n, shape, width):
    multiple = 8 if shape[1] < 1000 else 128
    one_kept = vocab_geometry(n, *shape, width, True, multiple, keep=False)
    assert fits(one_kept, n, *shape)
    assert one_kept.pass2[0].reuse and one_kept.pass2[0][:2] == one_kept.pass1[-1][:2]
    assert not any(c.reuse for c in one_kept.pass2[1:])
    geometry = vocab_geometry(n, *shape, width, True, multiple)
    assert fits(geometry, n, *shape)
    if geometry != one_kept:  # the kept geometry: N <= H, pass 2 computes no logits
        assert n <= shape[0] and geometry.recomputed == 0 and len(geometry.pass1) <= KEPT_MAX_CHUNKS
    for geo in (one_kept, geometry):
        assert geo.buffer_cols <= max(min(width, shape[1]), 1)
    assert fits(vocab_geometry(n, *shape, width, False, multiple), n, *shape)


def test_fits_rejects_kept_logits_that_a_dw_write_or_a_later_chunk_would_overwrite():
    g = kept_geometry(2048, *LLAMA, 3968)
    assert fits(g, 2048, *LLAMA)
    shifted = [c._replace(offset=0) if c.scratch else c for c in g.pass1]  # every chunk at the same place
    pass2 = tuple(c._replace(reuse=True) for c in reversed(shifted))
    assert not fits(g._replace(pass1=tuple(shifted), pass2=pass2), 2048, *LLAMA)
    late = g.pass1[-1]._replace(offset=g.pass1[-1].start * LLAMA[0])  # in its own dW rows
    pass1 = (*g.pass1[:-1], late)
    assert not fits(g._replace(pass1=pass1, pass2=(late._replace(reuse=True), *g.pass2[1:])), 2048, *LLAMA)


def test_llama_2048_kept_layout():
    """Llama-3 at 2048 tokens and the C=1 budget (3968 columns): 6 chunks, each about H / N = 2x the columns
    before it wider, every one kept for pass 2 (no logits GEMM there; the one-chunk-kept layout recomputes 42752
    columns)."""
    g = vocab_geometry(2048, *LLAMA, 3968, True)
    assert [c.width for c in g.pass1] == [3968, 7936, 15872, 31744, 63488, 5248]
    assert [c.offset for c in g.pass1[1:]] == [0, 2048 * 7936, 2048 * 23808, 2048 * 55552, 2048 * 119040]
    assert g.pass1[0].scratch is False and all(c.scratch for c in g.pass1[1:])
    assert all(c.reuse for c in g.pass2) and g.recomputed == 0 and g.buffer_cols == 3968
    assert vocab_geometry(2048, *LLAMA, 3968, True, keep=False).recomputed == 42752
    at_h = kept_geometry(4096, *LLAMA, 3968)  # N = H: the widths stop growing
    assert [c.width for c in at_h.pass1] == [3968] * 32 + [1280] and fits(at_h, 4096, *LLAMA)
    assert kept_geometry(4096, *LLAMA, 1024) is None  # 126 chunks > KEPT_MAX_CHUNKS


def test_frozen_head_is_never_kept_in_dw():
    assert vocab_geometry(2048, *LLAMA, 3968, False) == plain_geometry(LLAMA[1], 3968)


def test_llama_2048_layout():
    """Llama-3 at 2048 tokens and the C=1 budget (3968 columns), one chunk kept: pass 1 in 2 chunks, pass 2 in 5
    — 85504 columns reused, 28416 and 9472 in the scratch, the last 4864 in two buffer chunks (was 32 + 32)."""
    g = vocab_geometry(2048, *LLAMA, 3968, True, keep=False)
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


H, V = 32, 200
# rows of the two layouts at the C=1 budget: 24 (<= H): every chunk kept; 48: one chunk kept (80 columns, reused),
# one more in the scratch (48), the rest in three buffer chunks of 24
ROWS = {"kept": 24, "one_kept": 48}
N = ROWS["kept"]


@pytest.fixture(params=sorted(ROWS))
def rows(request, monkeypatch):
    """The kept layout wherever it applies: at these tiny shapes the cost model prefers the one-kept layout (its
    per-chunk cost outweighs GEMMs of next to nothing; see test_run_follows_the_cost_models_layout)."""
    monkeypatch.setattr(flce_plan, "keeps_every_chunk", lambda *a: True)
    flce_plan._plan.cache_clear()
    yield ROWS[request.param]
    flce_plan._plan.cache_clear()


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not (triton_utils.INTERPRET_AT_IMPORT or torch.cuda.is_available()):
        pytest.skip("Triton needs the interpreter or CUDA")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    monkeypatch.setattr(flce_plan, "VOCAB_ALIGN", 8)
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 32)
    return request.param


def _inputs(bias: bool, seed: int = 0, n: int = N):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=g).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.5).requires_grad_()
    target = torch.randint(0, V, (n,), generator=g)
    target[::5] = -100
    b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if bias else None
    return hidden, weight, target, b


def test_the_cases_exercise_every_kind_of_chunk(backend, rows):
    plan = K.flce_plan(rows, H, V, strategy="vocab", dtype=torch.float32)
    g = vocab_geometry(rows, H, V, plan.chunk_vocab, True, 8)
    kinds = {(c.scratch, c.reuse) for c in g.pass2}
    if rows <= H:
        assert kinds == {(True, True), (False, True)} and g.recomputed == plan.recomputed == 0, g
    else:
        assert kinds == {(True, True), (True, False), (False, False)} and plan.recomputed > 0, g
    assert plan.scratch


# the bias is one more GEMM operand and gradient, the same under every option: plain with and without it, each
# option once, with the bias on every other one
@pytest.mark.parametrize(
    "opts, bias",
    [
        ({}, False),
        ({}, True),
        ({"label_smoothing": 0.1}, True),
        ({"softcap": 3.0}, False),
        ({"reduction": "sum"}, True),
        ({"reduction": "none"}, False),
    ],
    ids=str,
)
def test_scratch_matches_the_reference(backend, rows, opts, bias):
    hidden, weight, target, b = _inputs(bias, n=rows)
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
    monkeypatch.setattr(flce_vocab, "vocab_geometry", lambda *a: seen.append(a[4]) or real(*a))
    hidden, weight, target, _ = _inputs(False)
    weight = weight.detach()
    out = K.fused_linear_cross_entropy(hidden, weight, target, strategy="vocab")
    (dh,) = torch.autograd.grad(out, hidden)
    ref, _ = flce_reference(hidden, weight, target, None)
    (rdh,) = torch.autograd.grad(ref, hidden)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dh, rdh, rtol=1e-4, atol=1e-5)
    assert seen == [False]


def test_logits_gemms_and_buffer(backend, rows, monkeypatch):
    """One logits GEMM per pass-1 chunk and per pass-2 chunk that is not reused (none when every chunk is kept);
    the budget buffer allocated is only as wide as the widest chunk that does not fit in the scratch."""
    hidden, weight, target, _ = _inputs(False, n=rows)
    calls, sizes = [], []
    real_logits, real_empty = flce_vocab._logits, torch.empty
    monkeypatch.setattr(flce_vocab, "_logits", lambda *a: calls.append(a[1].w.shape[0]) or real_logits(*a))
    monkeypatch.setattr(
        torch, "empty", lambda *s, **k: sizes.append(s[0] if len(s) == 1 else s) or real_empty(*s, **k)
    )
    out = K.fused_linear_cross_entropy(hidden, weight, target, strategy="vocab")
    monkeypatch.setattr(torch, "empty", real_empty)
    plan = K.flce_plan(rows, H, V, strategy="vocab", dtype=torch.float32)
    g = vocab_geometry(rows, H, V, plan.chunk_vocab, True, 8)
    assert calls == [c.width for c in g.pass1] + [c.width for c in g.pass2 if not c.reuse]
    assert rows * g.buffer_cols in sizes
    if g.buffer_cols != plan.chunk_vocab:
        assert rows * plan.chunk_vocab not in sizes
    torch.autograd.grad(out, [hidden, weight])


def test_the_buffer_is_freed_before_dx_is_cast(backend, rows, monkeypatch):
    """No view of the logits buffer is alive when dX is cast out of its fp32 accumulator (fp16 here, so the cast
    allocates): on the GPU that cast may take the buffer's memory instead of adding to the head's peak."""
    buffers, alive_at_cast = [], []
    real_views, real_dh = flce_vocab._views, flce_vocab._dh
    monkeypatch.setattr(flce_vocab, "_views", lambda *a: buffers.append(weakref.ref(a[-1])) or real_views(*a))
    monkeypatch.setattr(
        flce_vocab, "_dh", lambda *a: alive_at_cast.append([b() is not None for b in buffers]) or real_dh(*a)
    )
    hidden, weight, target, _ = _inputs(False, n=rows)
    h, w = hidden.detach().half().requires_grad_(), weight.detach().half().requires_grad_()
    out = K.fused_linear_cross_entropy(h, w, target, strategy="vocab")
    dh, _ = torch.autograd.grad(out, [h, w])
    assert dh.dtype == torch.float16 and len(buffers) == 2 and alive_at_cast == [[False, False]]
    ref, _ = flce_reference(hidden, weight, target, None)
    (rdh,) = torch.autograd.grad(ref, hidden)
    torch.testing.assert_close(dh.float(), rdh, rtol=2e-2, atol=2e-3)


def test_run_follows_the_cost_models_layout(backend, monkeypatch):
    """Unforced, the tiny case with N <= H gets the layout the model predicts faster (here the one-kept one), in
    the plan and in the run alike."""
    hidden, weight, target, _ = _inputs(False)
    calls = []
    real_logits = flce_vocab._logits
    monkeypatch.setattr(flce_vocab, "_logits", lambda *a: calls.append(a[1].w.shape[0]) or real_logits(*a))
    out = K.fused_linear_cross_entropy(hidden, weight, target, strategy="vocab")
    plan = K.flce_plan(N, H, V, strategy="vocab", dtype=torch.float32)
    assert not flce_plan.keeps_every_chunk(N, H, V, plan.chunk_vocab, 4, flce_plan.DEFAULT_PEAKS, 8)
    g = vocab_geometry(N, H, V, plan.chunk_vocab, True, 8, keep=False)
    assert plan.recomputed == g.recomputed > 0
    assert calls == [c.width for c in g.pass1] + [c.width for c in g.pass2 if not c.reuse]
    ref, _ = flce_reference(hidden, weight, target, None)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the vocabulary row kernels (interpreter)
STATS_MODES = ["lanes", "blocks"]


VOCAB_OPTS = [
    {},
    {"label_smoothing": 0.1},
    {"label_smoothing": 0.2, "class_weights": True},
    {"softcap": 3.0, "logit_scale": 0.5},
]


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("opts", VOCAB_OPTS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_vocab_row_kernels_match_torch(opts, dtype):
    n, v, w0 = 11, 45, 13  # chunks of 13 columns at offsets 0, 13, 26, 39 (last one 6 wide), blocks of 16
    x = (torch.randn(n, v, generator=g()) * 3).to(dtype)
    t = torch.randint(0, v, (n,), generator=g(1))
    t[[2, 7]] = -100
    opts = dict(opts)
    cw = torch.rand(v, generator=g(3)) + 0.5 if opts.pop("class_weights", False) else None
    o = FlceOptions(**opts)
    states = [flce_ref.new_state(n, "cpu"), flce_ref.new_state(n, "cpu")]
    for s in range(0, v, w0):
        chunk = x[:, s : s + w0].contiguous()
        flce_ref.stats_update_torch(chunk, s, t, states[0], opts=o, class_weights=cw, argmax=True)
        flce_triton.stats_update_triton(chunk, s, t, states[1], opts=o, class_weights=cw, argmax=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for a, b in zip(states[1], states[0], strict=True):
        close(a, b, tol)
    assert torch.equal(states[1].best_i, ce_ref.transform_logits(x, o.softcap, o.logit_scale).argmax(-1))
    kw = dict(ce_scale=0.3, z_scale=0.7, row_grad=torch.randn(n, generator=g(2)), opts=o, class_weights=cw)
    ce, _, coefs = flce_ref.row_losses(states[0], t, v, **kw)
    ref_rows = ce_ref.ce_rows_torch(
        x.clone(),
        t,
        ignore_index=-100,
        label_smoothing=o.label_smoothing,
        softcap=o.softcap,
        logit_scale=o.logit_scale,
        lse_square_scale=0.0,
        class_weights=cw,
        ce_grad_scale=0.3,
        z_grad_scale=0.7,
        row_grad=kw["row_grad"],
        compute_grad=False,
    )
    close(ce, ref_rows[0], tol)
    grad_ref = x.clone()
    ce_ref.ce_rows_torch(
        grad_ref,
        t,
        ignore_index=-100,
        label_smoothing=o.label_smoothing,
        softcap=o.softcap,
        logit_scale=o.logit_scale,
        lse_square_scale=0.0,
        class_weights=cw,
        ce_grad_scale=0.3,
        z_grad_scale=0.7,
        row_grad=kw["row_grad"],
        compute_grad=True,
    )
    for s in range(0, v, w0):
        a, b = x[:, s : s + w0].contiguous(), x[:, s : s + w0].contiguous()
        flce_ref.grad_inplace_torch(a, s, t, coefs, opts=o, class_weights=cw)
        flce_triton.grad_inplace_triton(b, s, t, coefs, opts=o, class_weights=cw)
        close(b, a, tol)
        close(a, grad_ref[:, s : s + w0], tol)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize(
    "opts", [{}, {"softcap": 3.0, "logit_scale": 0.5}], ids=lambda o: "-".join(o) or "plain"
)
@pytest.mark.parametrize("bias", [False, True])
def test_target_logit_kernel_matches_torch(opts, bias):
    n, h, v = 13, 40, 50  # H not a power of two
    hidden = torch.randn(n, h, generator=g()).half()
    weight = torch.randn(v, h, generator=g(1)).half()
    b = torch.randn(v, generator=g(2)) if bias else None
    t = torch.randint(0, v, (n,), generator=g(3))
    t[[1, 6]] = -100
    kw = dict(ignore_index=-100, softcap=opts.get("softcap"), logit_scale=opts.get("logit_scale", 1.0))
    got = target_logits_triton(hidden, weight, t, b, **kw)
    exp = target_logits_torch(hidden, weight, t, b, **kw)
    close(got, exp, 1e-6)
    raw = (hidden.double() @ weight.double().t()).gather(1, t.clamp(min=0)[:, None]).squeeze(1)
    raw = raw + (b.double()[t.clamp(min=0)] if bias else 0.0)
    close(exp, ce_ref.transform_logits(raw, kw["softcap"], kw["logit_scale"]), 1e-5)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("mode", STATS_MODES)
def test_vocab_stats_across_chunks_first_argmax(mode, monkeypatch):
    """Chunked statistics merge into the row state: logsumexp of the whole row, first argmax across chunks."""
    monkeypatch.setitem(ce_triton.ROW_STATS, "vocab_stats", (mode, 16))
    flce_triton._flags.cache_clear()
    x = tied_rows(50)
    x[0, [5, 45]] = 11.0  # the tie spans two vocabulary chunks
    t = torch.zeros(x.shape[0], dtype=torch.long)
    o = FlceOptions()
    state = flce_ref.new_state(x.shape[0], x.device)
    for s in range(0, 50, 20):
        flce_triton.stats_update_triton(
            x[:, s : s + 20].contiguous(), s, t, state, opts=o, class_weights=None, argmax=True
        )
    lse = torch.logsumexp(x.double(), -1)
    torch.testing.assert_close(state.m.double() + state.d.double().log(), lse, rtol=1e-6, atol=1e-5)
    assert torch.equal(state.best_i, x.argmax(-1))


# ---------------------------------------------------------------- CUDA: the Llama-3 head, bf16
@gpu
def test_flce_vocab_fp32_paths_agree(monkeypatch):
    """dX accumulated by cuBLAS in fp32 (``addmm(out_dtype=fp32)``, when this torch has it) vs upcast operands:
    both right, and the loss (bf16 logits + the exact fp32 target logit) within 1e-5 of float64 on both."""
    hidden, weight, target = llama_head("peaked", bt=1024, h=1024, v=32000)
    h64, w64 = leaf(hidden, torch.float64), weight.double()
    ref = F.cross_entropy(h64 @ w64.t(), target)
    (r,) = torch.autograd.grad(ref, h64)
    results = []
    for path in (flce_vocab._has_out_dtype("cuda"), False):
        monkeypatch.setattr(flce_vocab, "_has_out_dtype", lambda _t, path=path: path)
        h = leaf(hidden, torch.bfloat16)
        out = K.fused_linear_cross_entropy(h, weight, target, strategy="vocab", max_chunk_mib=4)
        (d,) = torch.autograd.grad(out, h)
        print(f"[gpu-check] vocab out_dtype={path} loss rel {rel(out, ref):.2e} d_hidden rel {rel(d, r):.2e}")
        assert rel(out, ref) < 1e-5 and rel(d, r) < 1e-2
        results.append(d)
    assert rel(results[0], results[1]) < 5e-3


def _vocab_step_and_peak(hidden, weight, target):
    """(loss, dh, dw, peak MiB above the inputs) of one vocab-strategy FLCE forward + grad at the C=1 budget."""
    h, w = leaf(hidden, torch.bfloat16), leaf(weight, torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = K.fused_linear_cross_entropy(h, w, target, strategy="vocab", chunk_mem_const=1)
    dh, dw = torch.autograd.grad(out, [h, w])
    torch.cuda.synchronize()
    return out.detach(), dh, dw, (torch.cuda.max_memory_allocated() - base) / 2**20


@pytest.mark.exclusive
@gpu
@pytest.mark.parametrize("bt", [2048, 4096])
def test_flce_vocab_scratch_same_grads_and_no_more_memory(monkeypatch, bt):
    """The vocab strategy with chunks in dW's not yet written memory (Llama-3 head, C=1), every chunk kept for pass
    2 (N <= H, the default there: 6 chunks at 2048 tokens, 33 at 4096) and only pass 1's last one: the same loss
    and gradients as the plain geometry (budget-buffer chunks only), and no higher peak."""
    hidden, weight, target = llama_head("random", bt)
    layouts = {
        "kept": lambda n, h, v, w, scratch, multiple, keep: vocab_geometry(
            n, h, v, w, scratch, multiple, True
        ),
        "one_kept": lambda n, h, v, w, scratch, multiple, keep: vocab_geometry(
            n, h, v, w, scratch, multiple, False
        ),
        "plain": lambda n, h, v, w, *a: plain_geometry(v, w),
    }
    # a first call allocates cuBLAS's workspace, once per process: it would count in whichever layout ran first
    _vocab_step_and_peak(hidden, weight, target)
    results = {}
    for name, layout in layouts.items():
        monkeypatch.setattr(flce_vocab, "vocab_geometry", layout)
        results[name] = _vocab_step_and_peak(hidden, weight, target)
    monkeypatch.setattr(flce_vocab, "vocab_geometry", vocab_geometry)
    lp, dhp, dwp, mp = results.pop("plain")
    for name, (ls, dhs, dws, ms) in results.items():
        print(f"\n[gpu-check] vocab {bt} {name} peak {ms:.1f} MiB vs plain {mp:.1f} MiB", flush=True)
        assert rel(ls, lp) < 1e-5 and rel(dhs, dhp) < 5e-3 and rel(dws, dwp) < 5e-3, name
        assert ms <= mp + 1.0, name


@gpu
@pytest.mark.parametrize("bt", [4096, 8192])
def test_flce_vocab_peak_is_dw_accumulator_and_buffer(bt):
    """The vocab strategy's peak above its inputs (Llama-3 head, C=1, the default layout) is dW, dX's fp32
    accumulator and the larger of the logits buffer and dX itself: the buffer is free before dX is cast out of
    the accumulator, so the cast reuses its memory (or needs only its own when it is the larger)."""
    hidden, weight, target = llama_head("random", bt)
    n, h, v = bt, hidden.shape[1], weight.shape[0]
    plan = K.flce_plan(n, h, v, strategy="vocab", chunk_mem_const=1)
    multiple = min(flce_plan.COL_MULTIPLE, flce_plan.VOCAB_ALIGN)
    peaks = flce_plan.peaks_of(hidden.device)
    keep = flce_plan.keeps_every_chunk(n, h, v, plan.chunk_vocab, 2, peaks, multiple)
    geometry = vocab_geometry(n, h, v, plan.chunk_vocab, True, multiple, keep)
    peak = _vocab_step_and_peak(hidden, weight, target)[-1]
    mib = lambda b: b / 2**20  # noqa: E731
    bound = mib(v * h * 2 + n * h * 4 + max(n * geometry.buffer_cols * 2, n * h * 2)) + 4.0
    print(
        f"\n[gpu-check] vocab {bt} peak {peak:.1f} MiB, bound {bound:.1f} MiB "
        f"(buffer {mib(n * geometry.buffer_cols * 2):.1f}, dX {mib(n * h * 2):.1f})",
        flush=True,
    )
    assert peak <= bound
