"""The functional losses follow torch's and the reference library's conventions, on both backends (Triton
through the interpreter): cross entropy returns the logits' dtype, both losses give the same structured output
(z-loss, token accuracy, predicted tokens with -1 on ignored rows), and class weights divide as torch divides."""

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import ce_reference
from transformers.loss import loss_utils

from liger_registry import kernels as K
from liger_registry.forwards.causal_lm import next_token_labels
from liger_registry.forwards.logits_loss import cross_entropy_loss
from liger_registry.kernels import triton_utils
from liger_registry.kernels.flce import plan as flce_planner

BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            not triton_utils.INTERPRET_AT_IMPORT, reason="CPU Triton runs need TRITON_INTERPRET=1 at import"
        ),
    ),
]
REDUCTIONS = ["mean", "sum", "none"]
STRATEGIES = ["tokens", "vocab"]
N, H, V = 13, 16, 50


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, request.param)
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)  # tiny rows still cross column blocks
    monkeypatch.setattr(flce_planner, "VOCAB_ALIGN", 8)  # and several vocabulary chunks
    return request.param


def _g(seed):
    return torch.Generator().manual_seed(seed)


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
def _expected_fields(logits, target, ignore_index, lse_square_scale):
    z = logits.float()
    valid = target != ignore_index
    pred = torch.where(valid, z.argmax(-1), torch.full_like(target, -1))
    acc = (pred == target)[valid].float().mean()
    _, zl = ce_reference(z, target, ignore_index=ignore_index, lse_square_scale=lse_square_scale)
    return zl, acc, pred


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
    zl, acc, pred = _expected_fields(x, t, ignore_index, 1e-2)
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
    zl, acc, pred = _expected_fields(3.0 * torch.tanh(x / 3.0), t, -100, 0.0)
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


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flce_predicted_tokens_are_minus_one_on_ignored_rows(backend, strategy):
    hidden = torch.randn(N, H, generator=_g(3))
    weight = torch.randn(V, H, generator=_g(4)) * 0.5
    t = _target()
    out = K.fused_linear_cross_entropy(
        hidden, weight, t, strategy=strategy, return_predicted_tokens=True, return_token_accuracy=True
    )
    _, acc, pred = _expected_fields(hidden @ weight.t(), t, -100, 0.0)
    assert torch.equal(out.predicted_tokens, pred)
    torch.testing.assert_close(out.token_accuracy, acc)


# ---------------------------------------------------------------- class weights: torch's division, any sign
WEIGHT_CASES = {
    # weights of the batch's non-ignored targets sum to a negative number: torch divides by it
    "negative-sum": {0: -3.0, 1: 1.0},
    # ... to exactly zero, some non-zero: +-inf (or nan) as torch
    "cancelling": {0: 1.0, 1: -1.0},
    # every non-ignored target weighs zero: 0 / 0
    "all-zero": {0: 0.0, 1: 0.0},
}


def _weighted_case(case):
    """Targets 0 and 1 only (and ignored rows), weights from the case, the other classes weigh 1."""
    t = torch.tensor([0, 1, 0, -100, 1, 0, 1, -100, 0, 1, 0, 1, -100])  # five of each
    w = torch.ones(V)
    for cls, value in WEIGHT_CASES[case].items():
        w[cls] = value
    return t, w


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_cross_entropy_weights_divide_as_torch(backend, case, label_smoothing):
    t, w = _weighted_case(case)
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


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_flce_weights_divide_as_torch(backend, case, strategy):
    t, w = _weighted_case(case)
    hidden = torch.randn(N, H, generator=_g(3)).requires_grad_()
    weight = torch.randn(V, H, generator=_g(4)) * 0.5
    ref = F.cross_entropy(hidden @ weight.t(), t, weight=w)
    out = K.fused_linear_cross_entropy(hidden, weight, t, class_weights=w, strategy=strategy)
    torch.testing.assert_close(out, ref, equal_nan=True)
    if case == "negative-sum":
        torch.testing.assert_close(torch.autograd.grad(out, hidden)[0], torch.autograd.grad(ref, hidden)[0])


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
