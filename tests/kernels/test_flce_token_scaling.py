"""FLCE token scaling (use_token_scaling): each token's loss times its detached target probability, against a
plain PyTorch formula, on both strategies and both backends (Triton through the interpreter)."""

import pytest
import torch
import torch.nn.functional as F

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.flce import plan as flce_planner


def token_scaled_reference(
    hidden,
    weight,
    target,
    *,
    reduction="mean",
    label_smoothing=0.0,
    softcap=None,
    lse_square_scale=0.0,
    ignore_index=-100,
):
    logits = (hidden @ weight.t()).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    ce = F.cross_entropy(logits, safe, reduction="none", label_smoothing=label_smoothing)
    lse = torch.logsumexp(logits, -1)
    p = torch.softmax(logits, -1).gather(1, safe[:, None]).squeeze(1).detach()
    rows = torch.where(valid, (ce + lse_square_scale * lse * lse) * p, torch.zeros_like(ce))
    if reduction == "none":
        return rows
    return rows.sum() if reduction == "sum" else rows.sum() / valid.sum().clamp(min=1)


def _inputs(n=29, h=16, v=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.7).requires_grad_()
    target = torch.randint(0, v, (n,), generator=g)
    target[::5] = -100
    return hidden, weight, target


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton":
        if not triton_utils.INTERPRET_AT_IMPORT:
            pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
        monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)
    monkeypatch.setenv(K.ENV_VAR, request.param)
    monkeypatch.setattr(flce_planner, "VOCAB_ALIGN", 8)  # several vocabulary chunks on tiny shapes
    return request.param


@pytest.mark.parametrize("strategy", ["tokens", "vocab"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "opts", [{}, {"label_smoothing": 0.1, "lse_square_scale": 1e-3, "softcap": 3.0}], ids=["plain", "all"]
)
def test_token_scaling_matches_formula(backend, strategy, reduction, opts):
    hidden, weight, target = _inputs()
    out = K.fused_linear_cross_entropy(
        hidden,
        weight,
        target,
        reduction=reduction,
        strategy=strategy,
        chunk_mem_const=4,
        use_token_scaling=True,
        **opts,
    )
    ref = token_scaled_reference(hidden, weight, target, reduction=reduction, **opts)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    go = torch.rand_like(ref) if reduction == "none" else torch.tensor(0.7)
    got = torch.autograd.grad(out, [hidden, weight], go)
    exp = torch.autograd.grad(ref, [hidden, weight], go)
    for a, e in zip(got, exp, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_token_scaling_changes_the_loss_and_all_ignored_is_zero():
    hidden, weight, target = _inputs()
    plain = K.fused_linear_cross_entropy(hidden, weight, target)
    scaled = K.fused_linear_cross_entropy(hidden, weight, target, use_token_scaling=True)
    assert scaled < plain  # every factor is a probability < 1
    ignored = torch.full_like(target, -100)
    zero = K.fused_linear_cross_entropy(hidden, weight, ignored, use_token_scaling=True)
    assert zero.item() == 0.0


def test_token_scaling_must_be_a_bool():
    with pytest.raises(ValueError, match="use_token_scaling"):
        K.FlceOptions(use_token_scaling=1)
