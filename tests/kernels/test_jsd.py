"""Fused linear JSD (kernels/jsd), the distillation loss: the PyTorch path against materialised logits and the
JSD rows, with and without a target, its argument checks; Triton through the interpreter on CPU against the
PyTorch path; on CUDA, fp32 and bf16 against float64."""

from __future__ import annotations

import pytest
import torch
from cases import GPU_DTYPES, close, cuda_g, g, gpu, grads, jsd_rows_differentiable, leaf
from cases import check64 as _check

from liger_registry import kernels as K


# ---------------------------------------------------------------- the PyTorch path
def _jsd_ref(sh, sw, th, tw, target, beta, temperature, ignore_index=-100):
    rows = jsd_rows_differentiable(sh @ sw.t(), th @ tw.t(), beta, temperature)
    valid = torch.ones_like(rows, dtype=torch.bool) if target is None else target != ignore_index
    return (rows * valid).sum() / valid.sum().clamp(min=1)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.3])
@pytest.mark.parametrize("with_target", [False, True])
def test_fused_linear_jsd_torch_path(beta, with_target):
    n, h, ht, v = 37, 16, 12, 50
    sh = torch.randn(n, h, generator=g(), requires_grad=True)
    sw = (torch.randn(v, h, generator=g(1)) * 0.5).requires_grad_()
    th = torch.randn(n, ht, generator=g(2))
    tw = torch.randn(v, ht, generator=g(3)) * 0.5
    target = torch.randint(0, v, (n,), generator=g(4)) if with_target else None
    if with_target:
        target[::3] = -100
    loss = K.fused_linear_jsd(sh, sw, th, tw, target, jsd_beta=beta, temperature=2.0)
    ref = _jsd_ref(sh, sw, th, tw, target, beta, 2.0)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(loss * 1.5, [sh, sw])
    r = torch.autograd.grad(ref * 1.5, [sh, sw])
    for a, e in zip(got, r, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_fused_linear_jsd_checks():
    sh, sw = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(ValueError, match="chunk_mem_const"):
        K.fused_linear_jsd(sh, sw, sh, sw, chunk_mem_const=True)
    with pytest.raises(ValueError, match="jsd_beta"):
        K.fused_linear_jsd(sh, sw, sh, sw, jsd_beta=1.5)


# ---------------------------------------------------------------- Triton through the interpreter
@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd_triton(beta, monkeypatch):
    n, h, v = 21, 16, 50
    sh = torch.randn(n, h, generator=g()).requires_grad_()
    sw = (torch.randn(v, h, generator=g(1)) * 0.5).requires_grad_()
    th, tw = torch.randn(n, h, generator=g(2)), torch.randn(v, h, generator=g(3)) * 0.5
    target = torch.randint(0, v, (n,), generator=g(4))
    target[::3] = -100
    loss = K.fused_linear_jsd(sh, sw, th, tw, target, jsd_beta=beta, temperature=1.5)
    monkeypatch.setenv(K.ENV_VAR, "torch")
    ref = K.fused_linear_jsd(sh, sw, th, tw, target, jsd_beta=beta, temperature=1.5)
    close(loss, ref, 1e-5)
    for a, e in zip(torch.autograd.grad(loss, [sh, sw]), torch.autograd.grad(ref, [sh, sw]), strict=True):
        close(a, e, 1e-5)


# ---------------------------------------------------------------- CUDA: fp32 and bf16 against float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_linear_jsd(dtype, beta):
    gen = cuda_g(7)
    n, h, v = 1027, 512, 32007
    sh0, th0 = (
        torch.randn(n, h, device="cuda", generator=gen),
        torch.randn(n, h, device="cuda", generator=gen),
    )
    sw0, tw0 = (
        torch.randn(v, h, device="cuda", generator=gen) * 0.05,
        torch.randn(v, h, device="cuda", generator=gen) * 0.05,
    )
    t = torch.randint(0, v, (n,), device="cuda", generator=gen)
    t[::4] = -100
    sh, sw = leaf(sh0, dtype), leaf(sw0, dtype)
    out = K.fused_linear_jsd(sh, sw, th0.to(dtype), tw0.to(dtype), t, jsd_beta=beta, temperature=2.0)
    sh64, sw64 = leaf(sh0.to(dtype), torch.float64), leaf(sw0.to(dtype), torch.float64)
    rows = jsd_rows_differentiable(
        sh64 @ sw64.t(), th0.to(dtype).double() @ tw0.to(dtype).double().t(), beta, 2.0
    )
    valid = t != -100
    ref = rows[valid].sum() / valid.sum()
    case = f"fused_linear_jsd beta={beta}"
    _check(case, "loss", out, ref, dtype)
    for name, a, e in zip(
        ["d_hidden", "d_weight"], grads(out, [sh, sw], None), grads(ref, [sh64, sw64], None), strict=True
    ):
        _check(case, name, a, e, dtype)
