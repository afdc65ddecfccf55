"""Cross entropy (kernels/ce) on both backends (Triton through the interpreter on CPU, rows crossing column
blocks of 16): the PyTorch path against F.cross_entropy, the row kernels against the PyTorch rows, the row
statistics (lanes and blocks) with first-argmax ties; torch's and the reference library's conventions (the
logits' dtype back, the structured output, class weights dividing as torch divides); the opt-in in-place
backward and its refusals; on CUDA, fp32 and bf16 against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cases import (
    GPU_DTYPES,
    WEIGHT_CASES,
    ce_ref,
    ce_reference,
    ce_rows_triton,
    ce_triton,
    close,
    cuda_g,
    expected_fields,
    flce_plan,
    gpu,
    leaf,
    tied_rows,
    triton_utils,
    weighted_case,
)
from cases import check64 as _check
from cases import g as _g
from cases import grads as _grads
from transformers.loss import loss_utils

from liger_registry import kernels as K
from liger_registry.forwards.causal_lm import next_token_labels
from liger_registry.forwards.logits_loss import cross_entropy_loss

N, H, V = 13, 16, 50


@pytest.fixture
def backend(backend, monkeypatch):
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)  # tiny rows still cross column blocks
    monkeypatch.setattr(flce_plan, "VOCAB_ALIGN", 8)  # and several vocabulary chunks
    return backend


# ---------------------------------------------------------------- the PyTorch path
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "opts",
    [{}, {"label_smoothing": 0.1}, {"lse_square_scale": 1e-2}, {"class_weights": True}, {"softcap": 4.0}],
    ids=lambda o: "-".join(o) or "plain",
)
def test_cross_entropy_torch_path(opts, reduction):
    logits = torch.randn(9, 40, generator=_g(), requires_grad=True)
    target = torch.randint(0, 40, (9,), generator=_g(1))
    target[2] = -100
    opts = dict(opts)
    if opts.get("class_weights"):
        opts["class_weights"] = torch.rand(40, generator=_g(3)) + 0.5
    softcap = opts.pop("softcap", None)
    weight = opts.pop("class_weights", None)
    got = K.cross_entropy(logits, target, weight, reduction=reduction, softcap=softcap, **opts)
    opts["class_weights"] = weight
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    ref, _ = ce_reference(z, target, reduction=reduction, **opts)
    torch.testing.assert_close(got, ref)
    go = torch.randn_like(ref)
    (g1,) = torch.autograd.grad(got, logits, go)
    (g2,) = torch.autograd.grad(ref, logits, go)
    torch.testing.assert_close(g1, g2)


# ---------------------------------------------------------------- Triton through the interpreter
CE_OPTS = [
    {},
    {"label_smoothing": 0.1},
    {"softcap": 3.0},
    {"logit_scale": 0.5, "lse_square_scale": 1e-2},
    {"class_weights": True, "label_smoothing": 0.2},
]


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("opts", CE_OPTS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ce_rows_kernel_matches_torch(opts, dtype):
    x = (torch.randn(9, 50, generator=_g()) * 3).to(dtype)
    t = torch.randint(0, 50, (9,), generator=_g(1))
    t[[2, 5]] = -100
    o = dict(
        ignore_index=-100,
        label_smoothing=0.0,
        softcap=None,
        logit_scale=1.0,
        lse_square_scale=0.0,
        class_weights=None,
        ce_grad_scale=0.3,
        z_grad_scale=0.7,
        row_grad=torch.randn(9, generator=_g(2)),
        compute_grad=True,
    )
    o.update(opts)
    if o["class_weights"] is True:
        o["class_weights"] = torch.rand(50, generator=_g(3)) + 0.5
    b1, b2 = x.clone(), x.clone()
    r1 = ce_ref.ce_rows_torch(b1, t, **o)
    r2 = ce_rows_triton(b2, t, **o)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    close(r2[0], r1[0], tol)
    close(r2[1], r1[1], tol)
    assert torch.equal(r2[2], r1[2])
    close(b2, b1, tol)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "grad-out"])
def test_the_reversed_gradient_pass_writes_the_same_values(in_place, monkeypatch):
    """GRAD_REVERSED walks the gradient pass's column blocks last to first: every value the same, to the bit, and
    the PyTorch rows' (rows of 50 columns cross four blocks of 16, the last one partial)."""
    from liger_registry.kernels.ce import triton_kernels

    x = torch.randn(9, 50, generator=_g()) * 3
    t = torch.randint(0, 50, (9,), generator=_g(1))
    t[4] = -100
    o = dict(ignore_index=-100, label_smoothing=0.1, softcap=3.0, logit_scale=1.0, lse_square_scale=1e-2)
    o.update(class_weights=torch.rand(50, generator=_g(3)) + 0.5, ce_grad_scale=0.3, z_grad_scale=0.7)
    o.update(row_grad=torch.randn(9, generator=_g(2)), compute_grad=True)
    grads, losses = [], []
    for reversed_ in (False, True):
        monkeypatch.setattr(triton_kernels, "GRAD_REVERSED", reversed_)
        buf = x.clone()
        out = None if in_place else torch.full_like(x, float("nan"))
        ce, _, _ = ce_rows_triton(buf, t, **o, grad_out=out)
        grads.append(buf if in_place else out)
        losses.append(ce)
    assert torch.equal(grads[0], grads[1]) and torch.equal(losses[0], losses[1])
    ref = x.clone()
    ce_ref.ce_rows_torch(ref, t, **o)
    close(grads[1], ref, 1e-5)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cross_entropy_triton(reduction, dtype):
    logits = (torch.randn(11, 50, generator=_g()) * 2).to(dtype).requires_grad_()
    t = torch.randint(0, 50, (11,), generator=_g(1))
    t[3] = -100
    out = K.cross_entropy(logits, t, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)
    ref, _ = ce_reference(logits, t, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    close(out, ref, tol)
    go = torch.randn_like(ref)
    close(torch.autograd.grad(out, logits, go)[0], torch.autograd.grad(ref, logits, go)[0], tol)


STATS_MODES = ["lanes", "blocks"]


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("mode", STATS_MODES)
@pytest.mark.parametrize("n_cols", [37, 48])
def test_ce_rows_stats_lse_and_first_argmax(n_cols, mode, monkeypatch):
    """Both statistics passes (per-lane state, block reductions) give torch's logsumexp and torch.argmax's first
    index on ties."""
    monkeypatch.setitem(ce_triton.ROW_STATS, "ce_rows", (mode, 16))
    x = tied_rows(n_cols)
    t = torch.zeros(x.shape[0], dtype=torch.long)
    o = dict(ignore_index=-100, label_smoothing=0.0, softcap=None, logit_scale=1.0, lse_square_scale=1.0)
    kw = dict(class_weights=None, ce_grad_scale=1.0, z_grad_scale=1.0, row_grad=None, compute_grad=False)
    ce, z, am = ce_rows_triton(x.clone(), t, **o, **kw, argmax_mode=2)
    lse = torch.logsumexp(x.double(), -1)
    torch.testing.assert_close(ce.double(), lse - x[:, 0].double(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(z.double(), lse * lse, rtol=1e-6, atol=1e-3)
    assert torch.equal(am, x.argmax(-1))


# ---------------------------------------------------------------- conventions, both backends
REDUCTIONS = ["mean", "sum", "none"]
N, H, V = 13, 16, 50


def _logits(dtype=torch.float32, seed=0):
    return (torch.randn(N, V, generator=_g(seed)) * 2).to(dtype)


def _target(ignore_index=-100):
    t = torch.randint(0, V, (N,), generator=_g(1))
    t[[3, 7]] = ignore_index
    return t


def _low_precision(backend):
    # the interpreter has no bf16 arithmetic; bf16 is checked on the torch backend here and on the GPU
    return [torch.float16] + ([torch.bfloat16] if backend == "torch" else [])


# ---------------------------------------------------------------- the loss comes back in the logits' dtype
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_returns_the_logits_dtype(backend, reduction):
    t = _target()
    for dtype in _low_precision(backend):
        x = _logits(dtype).requires_grad_()
        out = K.cross_entropy(x, t, reduction=reduction, lse_square_scale=1e-3, return_z_loss=True)
        ref = F.cross_entropy(x, t, reduction=reduction)
        assert out.loss.dtype == out.z_loss.dtype == ref.dtype == dtype
        # accumulated in fp32 and rounded once: the fp32 loss rounded to the dtype, within one rounding
        exact, z = ce_reference(x.detach().float(), t, reduction=reduction, lse_square_scale=1e-3)
        ulp = torch.finfo(dtype).eps
        torch.testing.assert_close(out.loss.float(), exact.to(dtype).float(), rtol=ulp, atol=0.0)
        torch.testing.assert_close(out.z_loss.float(), z.to(dtype).float(), rtol=ulp, atol=0.0)
        # and torch's own low-precision loss is as close as its rounding of log_softmax lets it be
        plain = K.cross_entropy(x, t, reduction=reduction)
        assert plain.dtype == dtype
        torch.testing.assert_close(plain.float(), ref.float(), rtol=8 * ulp, atol=8 * ulp)
        (g,) = torch.autograd.grad(out.loss, x, torch.ones_like(out.loss))
        assert g.dtype == dtype


def test_cross_entropy_fp32_and_fp64_dtypes(backend):
    t = _target()
    assert K.cross_entropy(_logits(), t).dtype == torch.float32
    if backend == "torch":  # the Triton kernels take no float64
        assert K.cross_entropy(_logits(torch.float64), t).dtype == torch.float64


def test_the_forwards_cross_entropy_matches_transformers_causal_lm_loss(backend):
    """The loss the forward computes with cross_entropy on (the kernel on fp32 logits) is transformers'
    ForCausalLMLoss, which upcasts the logits: fp32 whatever the logits' dtype, with or without num_items."""
    labels = torch.randint(0, V, (1, N), generator=_g(2))
    labels[0, 4] = -100
    logits = _logits(torch.float16)[None]
    for n_items in (None, torch.tensor(9)):
        ref = loss_utils.ForCausalLMLoss(logits, labels, V, num_items_in_batch=n_items)
        ours = cross_entropy_loss(logits, next_token_labels(labels, {}), -100, n_items)
        assert ours.dtype == ref.dtype == torch.float32
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the structured output of both losses
@pytest.mark.parametrize("ignore_index", [-100, -1, 5])
def test_cross_entropy_structured_output(backend, ignore_index):
    t = _target(ignore_index)
    t[t == ignore_index] = ignore_index
    x = _logits()
    plain = K.cross_entropy(x, t, ignore_index=ignore_index)
    assert isinstance(plain, torch.Tensor)
    out = K.cross_entropy(
        x,
        t,
        ignore_index=ignore_index,
        lse_square_scale=1e-2,
        return_z_loss=True,
        return_token_accuracy=True,
        return_predicted_tokens=True,
    )
    assert isinstance(out, K.CrossEntropyOutput) and K.CrossEntropyOutput is K.FLCEOutput
    zl, acc, pred = expected_fields(x, t, ignore_index, 1e-2)
    torch.testing.assert_close(out.z_loss, zl)
    torch.testing.assert_close(out.token_accuracy, acc)
    assert out.token_accuracy.dtype == torch.float32
    assert out.predicted_tokens.dtype == torch.long and torch.equal(out.predicted_tokens, pred)
    assert (out.predicted_tokens[t == ignore_index] == -1).all()
    only = K.cross_entropy(x, t, ignore_index=ignore_index, return_token_accuracy=True)
    assert only.z_loss is None and only.predicted_tokens is None
    torch.testing.assert_close(only.token_accuracy, acc)
    torch.testing.assert_close(only.loss, plain)


def test_cross_entropy_structured_output_with_inplace_backward_and_softcap(backend):
    """The predictions are read in the pass that writes the gradient over the logits; softcap keeps the order."""
    t = _target()
    x = _logits()
    zl, acc, pred = expected_fields(3.0 * torch.tanh(x / 3.0), t, -100, 0.0)
    logits = x.clone().requires_grad_()
    out = K.cross_entropy(
        logits * 1.0,
        t,
        softcap=3.0,
        inplace_backward=True,
        return_token_accuracy=True,
        return_predicted_tokens=True,
    )
    assert torch.equal(out.predicted_tokens, pred)
    torch.testing.assert_close(out.token_accuracy, acc)
    out.loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_cross_entropy_all_ignored_structured_output(backend):
    t = torch.full((N,), -100)
    out = K.cross_entropy(_logits(), t, return_token_accuracy=True, return_predicted_tokens=True)
    assert out.loss == 0 and out.token_accuracy == 0
    assert (out.predicted_tokens == -1).all()


# ---------------------------------------------------------------- class weights: torch's division, any sign
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_cross_entropy_weights_divide_as_torch(backend, case, label_smoothing):
    t, w = weighted_case(case)
    x = _logits().requires_grad_()
    ref = F.cross_entropy(x, t, weight=w, label_smoothing=label_smoothing)
    out = K.cross_entropy(x, t, w, label_smoothing=label_smoothing)
    if case == "cancelling" and label_smoothing:
        # torch divides its two terms by the zero sum apart (nan when their signs differ); ours share one
        # division: +-inf. Both say the same: this mean is undefined.
        assert not torch.isfinite(out) and not torch.isfinite(ref)
        return
    torch.testing.assert_close(out, ref, equal_nan=True)
    if case == "negative-sum":
        (g,) = torch.autograd.grad(out, x)
        (gr,) = torch.autograd.grad(ref, x)
        torch.testing.assert_close(g, gr)


def test_all_ignored_stays_zero_with_weights(backend):
    """No target counts: 0 with zero gradients (the reference library's rule; torch gives 0 / 0)."""
    t = torch.full((N,), -100)
    x = _logits().requires_grad_()
    out = K.cross_entropy(x, t, torch.rand(V, generator=_g(5)))
    assert out == 0
    (g,) = torch.autograd.grad(out, x)
    assert (g == 0).all()


# ---------------------------------------------------------------- the custom op carries the predictions
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("argmax_mode", [0, 1])
def test_cross_entropy_op_fake_matches_real(backend, reduction, argmax_mode):
    x = _logits().requires_grad_()
    args = (x, _target(), None, -100, 0.0, None, 1e-3, reduction, True, argmax_mode, backend)
    # test_aot_dispatch_dynamic fails for this op before and after the predictions were added (the saved
    # gradient as an output); the custom-op work on torch.compile owns it
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.liger_registry.cross_entropy_fwd.default, args, test_utils=utils)


def test_cross_entropy_structured_output_compiles(backend):
    t = _target()

    def step(x):
        out = K.cross_entropy(
            x, t, return_token_accuracy=True, return_predicted_tokens=True, return_z_loss=True
        )
        return out.loss, out.token_accuracy, out.predicted_tokens

    x = _logits(torch.float16).requires_grad_()
    eager = step(x)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(x)
    for a, b in zip(compiled, eager, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------- inplace_backward, both backends
def _logits_nv(n=11, v=50, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, v, generator=g) * 2).to(dtype)


def _target_nv(n=11, v=50):
    t = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(1))
    t[3] = -100
    return t


def _plain_grad(logits, target, opts):
    """d loss / d logits for grad_output 1, from F.cross_entropy (cases.ce_reference)."""
    opts = dict(opts)
    softcap = opts.pop("softcap", None)
    z = logits.float()
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    loss, _ = ce_reference(z, target, **opts)
    return torch.autograd.grad(loss, logits, torch.ones_like(loss))[0].float()


INPLACE_OPTIONS = [
    {},
    {"reduction": "sum", "label_smoothing": 0.1},
    {"reduction": "none", "softcap": 3.0, "lse_square_scale": 1e-3},
]


@pytest.mark.parametrize("opts", INPLACE_OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_same_loss_and_grad_as_default_and_grad_left_in_logits(backend, opts, dtype):
    t = _target_nv()
    ref_logits = _logits_nv(dtype=dtype).requires_grad_()
    ref = K.cross_entropy(ref_logits, t, **opts)
    logits = _logits_nv(dtype=dtype).requires_grad_()
    before = logits.detach().clone()
    out = K.cross_entropy(logits, t, inplace_backward=True, **opts)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert not torch.equal(logits.detach(), before)  # overwritten in the forward
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    plain_logits = _logits_nv(dtype=dtype).requires_grad_()
    torch.testing.assert_close(
        logits.detach().float(), _plain_grad(plain_logits, t, opts), rtol=tol, atol=tol
    )
    go = torch.rand_like(ref) + 0.5
    ref.backward(go)
    out.backward(go)
    torch.testing.assert_close(logits.grad.float(), ref_logits.grad.float(), rtol=tol, atol=tol)
    assert logits.grad.data_ptr() == logits.data_ptr()  # no [N, V] buffer besides the logits
    torch.testing.assert_close(ref_logits.detach(), before, rtol=0, atol=0)


def test_matches_f_cross_entropy_through_a_whole_view(backend):
    """transformers' loss passes ``logits.float().view(-1, V)``: a view of the whole tensor is accepted."""
    base = _logits_nv().reshape(1, 11, 50).requires_grad_()
    up = base * 1.0  # a non-leaf whose backward saves nothing of its output
    t = _target_nv()
    loss = K.cross_entropy(up.view(-1, 50), t, inplace_backward=True)
    ref_base = _logits_nv().reshape(1, 11, 50).requires_grad_()
    ref = F.cross_entropy(ref_base.view(-1, 50), t)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(base.grad, ref_base.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        up.detach(), ref_base.grad, rtol=1e-6, atol=1e-6
    )  # the base holds the gradient


def test_no_grad_leaves_logits_untouched(backend):
    logits = _logits_nv().requires_grad_()
    before = logits.detach().clone()
    with torch.no_grad():
        K.cross_entropy(logits, _target_nv(), inplace_backward=True)
    assert torch.equal(logits, before)


def test_refuses_non_contiguous_logits(backend):
    logits = _logits_nv(50, 11).t().requires_grad_()
    with pytest.raises(ValueError, match="contiguous"):
        K.cross_entropy(logits, _target_nv(), inplace_backward=True)


def test_refuses_a_partial_view(backend):
    base = _logits_nv(12, 50).requires_grad_()
    with pytest.raises(ValueError, match="partial view"):
        K.cross_entropy(
            base[:11], _target_nv(), inplace_backward=True
        )  # contiguous rows, but not all of base


def test_logits_saved_by_another_node_fail_at_backward(backend):
    x = _logits_nv().requires_grad_()
    logits = torch.tanh(x)  # tanh's backward saved its output: the tensor that gets overwritten
    loss = K.cross_entropy(logits, _target_nv(), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_default_refuses_nothing_and_never_writes(backend):
    base = _logits_nv(12, 50).requires_grad_()
    before = base.detach().clone()
    K.cross_entropy(base[:11], _target_nv()).backward()
    assert torch.equal(base.detach(), before)


def test_refused_under_torch_compile(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match="eagerly only"):
        K.cross_entropy(_logits_nv().requires_grad_(), _target_nv(), inplace_backward=True)


# ---------------------------------------------------------------- CUDA: fp32 and bf16 against float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_cross_entropy(dtype):
    gen = cuda_g(2)
    logits = torch.randn(1031, 50257, device="cuda", generator=gen) * 3
    t = torch.randint(0, 50257, (1031,), device="cuda", generator=gen)
    t[::5] = -100
    x = leaf(logits, dtype)
    out = K.cross_entropy(x, t, label_smoothing=0.05, lse_square_scale=1e-4)
    x64 = leaf(logits.to(dtype), torch.float64)
    lse = torch.logsumexp(x64, -1)
    valid = t != -100
    ref = F.cross_entropy(x64, t, label_smoothing=0.05) + (1e-4 * lse * lse)[valid].mean()
    _check("cross_entropy", "loss", out, ref, dtype)
    _check("cross_entropy", "d_logits", _grads(out, [x], None)[0], _grads(ref, [x64], None)[0], dtype)


@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_cross_entropy_inplace_backward(dtype):
    """The opt-in in-place backward: the default's loss and gradient, the gradient left in the logits' storage."""
    gen = cuda_g(2)
    logits = torch.randn(1031, 50257, device="cuda", generator=gen) * 3
    t = torch.randint(0, 50257, (1031,), device="cuda", generator=gen)
    t[::5] = -100
    x, y = leaf(logits, dtype), leaf(logits, dtype)
    ref = K.cross_entropy(x, t, label_smoothing=0.05)
    out = K.cross_entropy(y, t, label_smoothing=0.05, inplace_backward=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    (ref * 0.5).backward()
    (out * 0.5).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=0, atol=0)
    assert y.grad.data_ptr() == y.data_ptr()


@gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_bf16_conventions(reduction):
    """The logits' dtype back, the structured output, -1 predicted on ignored rows, torch's loss."""
    gen = cuda_g(3)
    x = (torch.randn(1031, 50257, device="cuda", generator=gen) * 3).bfloat16()
    t = torch.randint(0, 50257, (1031,), device="cuda", generator=gen)
    t[::5] = -100
    out = K.cross_entropy(
        x,
        t,
        reduction=reduction,
        return_z_loss=True,
        return_token_accuracy=True,
        return_predicted_tokens=True,
    )
    ref = F.cross_entropy(x.float(), t, reduction=reduction)
    assert out.loss.dtype == out.z_loss.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss, ref.bfloat16(), rtol=2**-7, atol=0.0)
    valid = t != -100
    pred = torch.where(valid, x.float().argmax(-1), -1)
    assert torch.equal(out.predicted_tokens, pred)
    torch.testing.assert_close(out.token_accuracy, (pred == t)[valid].float().mean())
