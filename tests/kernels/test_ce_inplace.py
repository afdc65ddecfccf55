"""cross_entropy(inplace_backward=True): same loss and gradient as the default, the gradient left in the logits'
storage, and the refusals of kernels/ce/op.py, on both backends (Triton through the interpreter)."""

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import ce_reference

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils

BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            not triton_utils.INTERPRET_AT_IMPORT, reason="CPU Triton runs need TRITON_INTERPRET=1 at import"
        ),
    ),
]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, request.param)
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)  # tiny rows still cross column blocks
    return request.param


def _logits(n=11, v=50, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, v, generator=g) * 2).to(dtype)


def _target(n=11, v=50):
    t = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(1))
    t[3] = -100
    return t


def _plain_grad(logits, target, opts):
    """d loss / d logits for grad_output 1, from F.cross_entropy (kernel_refs)."""
    opts = dict(opts)
    softcap = opts.pop("softcap", None)
    z = logits.float()
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    loss, _ = ce_reference(z, target, **opts)
    return torch.autograd.grad(loss, logits, torch.ones_like(loss))[0].float()


OPTIONS = [
    {},
    {"reduction": "sum", "label_smoothing": 0.1},
    {"reduction": "none", "softcap": 3.0, "lse_square_scale": 1e-3},
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_same_loss_and_grad_as_default_and_grad_left_in_logits(backend, opts, dtype):
    t = _target()
    ref_logits = _logits(dtype=dtype).requires_grad_()
    ref = K.cross_entropy(ref_logits, t, **opts)
    logits = _logits(dtype=dtype).requires_grad_()
    before = logits.detach().clone()
    out = K.cross_entropy(logits, t, inplace_backward=True, **opts)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert not torch.equal(logits.detach(), before)  # overwritten in the forward
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    plain_logits = _logits(dtype=dtype).requires_grad_()
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
    base = _logits().reshape(1, 11, 50).requires_grad_()
    up = base * 1.0  # a non-leaf whose backward saves nothing of its output
    t = _target()
    loss = K.cross_entropy(up.view(-1, 50), t, inplace_backward=True)
    ref_base = _logits().reshape(1, 11, 50).requires_grad_()
    ref = F.cross_entropy(ref_base.view(-1, 50), t)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(base.grad, ref_base.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        up.detach(), ref_base.grad, rtol=1e-6, atol=1e-6
    )  # the base holds the gradient


def test_no_grad_leaves_logits_untouched(backend):
    logits = _logits().requires_grad_()
    before = logits.detach().clone()
    with torch.no_grad():
        K.cross_entropy(logits, _target(), inplace_backward=True)
    assert torch.equal(logits, before)


def test_refuses_non_contiguous_logits(backend):
    logits = _logits(50, 11).t().requires_grad_()
    with pytest.raises(ValueError, match="contiguous"):
        K.cross_entropy(logits, _target(), inplace_backward=True)


def test_refuses_a_partial_view(backend):
    base = _logits(12, 50).requires_grad_()
    with pytest.raises(ValueError, match="partial view"):
        K.cross_entropy(base[:11], _target(), inplace_backward=True)  # contiguous rows, but not all of base


def test_logits_saved_by_another_node_fail_at_backward(backend):
    x = _logits().requires_grad_()
    logits = torch.tanh(x)  # tanh's backward saved its output: the tensor that gets overwritten
    loss = K.cross_entropy(logits, _target(), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_default_refuses_nothing_and_never_writes(backend):
    base = _logits(12, 50).requires_grad_()
    before = base.detach().clone()
    K.cross_entropy(base[:11], _target()).backward()
    assert torch.equal(base.detach(), before)


def test_refused_under_torch_compile(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(ValueError, match="eagerly only"):
        K.cross_entropy(_logits().requires_grad_(), _target(), inplace_backward=True)
