"""RMSNorm and the fused add + RMSNorm without a weight (``weight=None``: ``nn.RMSNorm(elementwise_affine=False)``,
the reference library's ``W=None``) against PyTorch references, on both backends (Triton through the interpreter),
fp32 and fp16, forward and the input gradients; and the module drop-in on norms that hold no weight."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.gemma3n import modeling_gemma3n

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.norm import add_rms_norm
from liger_registry.modules.norm import rms_norm_forward
from liger_registry.schemas import RmsNormSpec

ROWS, H, EPS = 13, 40, 1e-6  # 13 rows over several backward programs; 40 columns in a 64-wide block
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
MODES = ("llama", "gemma", "none")


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _x(dtype, seed=1, scale=3.0):
    """Rows with a stride larger than the row (the middle third of a wider buffer)."""
    return (torch.randn(ROWS, 3 * H, generator=_g(seed)) * scale).to(dtype)[:, H : 2 * H].requires_grad_()


def _reference(x, mode):
    """``x / rms(x)`` as each casting mode rounds it: upcast, normalise, cast back (llama, gemma: what
    ``nn.RMSNorm(elementwise_affine=False)`` computes); or all in x's dtype (none)."""
    if mode == "none":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _assert_close(ours, ref, dtype):
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        tol = TOL[dtype] * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=tol, msg=lambda m, i=i: f"tensor {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_rms_norm_without_weight(backend, mode, dtype):
    x = _x(dtype)
    y, ref = K.rms_norm(x, None, EPS, casting_mode=mode), _reference(x, mode)
    if backend == "torch" and mode != "none":
        assert torch.equal(y, nn.RMSNorm(H, eps=EPS, elementwise_affine=False)(x))
    dy = torch.randn(y.shape, generator=_g(2)).to(dtype)
    _assert_close((y, *torch.autograd.grad(y, x, dy)), (ref, *torch.autograd.grad(ref, x, dy)), dtype)


def test_offset_does_not_apply_without_weight(backend):
    x = _x(torch.float32)
    torch.testing.assert_close(K.rms_norm(x, None, EPS, offset=1.0), K.rms_norm(x, None, EPS), rtol=0, atol=0)


def test_in_place_backward_without_weight(backend):
    x = _x(torch.float32)
    y = K.rms_norm(x, None, EPS, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(2))
    y.backward(dy.clone())
    (expected,) = torch.autograd.grad(_reference(x, "llama"), x, dy)
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma"])
def test_add_rms_norm_without_weight(backend, mode, dtype):
    x, residual = _x(dtype), _x(dtype, seed=3, scale=1.0)
    s, y = add_rms_norm(x, residual, None, EPS, casting_mode=mode)
    ref_s = residual + x
    ref_y = _reference(ref_s, mode)
    gs, gy = (torch.randn(ROWS, H, generator=_g(seed)).to(dtype) for seed in (4, 5))
    grads = torch.autograd.grad((s, y), (x, residual), (gs, gy))
    ref_grads = torch.autograd.grad((ref_s, ref_y), (x, residual), (gs, gy))
    _assert_close((s, y, *grads), (ref_s, ref_y, *ref_grads), dtype)


NORMS = {
    "nn.RMSNorm(elementwise_affine=False)": (
        lambda: nn.RMSNorm(H, eps=EPS, elementwise_affine=False),
        RmsNormSpec(targets=["RMSNorm"], casting_mode="gemma", eps_attr="eps"),
    ),
    "Gemma3nRMSNorm(with_scale=False)": (  # no weight attribute at all
        lambda: modeling_gemma3n.Gemma3nRMSNorm(H, eps=EPS, with_scale=False),
        RmsNormSpec(targets=["Gemma3nRMSNorm"], casting_mode="gemma", eps_attr=["variance_epsilon", "eps"]),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(NORMS))
def test_module_forward_on_a_norm_without_weight(backend, name, dtype):
    make, spec = NORMS[name]
    norm = make()
    x = _x(dtype)
    ours, ref = rms_norm_forward(spec)(norm, x), norm(x)
    dy = torch.randn(ref.shape, generator=_g(2)).to(dtype)
    _assert_close((ours, *torch.autograd.grad(ours, x, dy)), (ref, *torch.autograd.grad(ref, x, dy)), dtype)


def test_rejects_a_weight_of_the_wrong_shape_or_type():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must be a \[8\] tensor or None"):
        K.rms_norm(x, torch.ones(4), EPS)
    with pytest.raises(ValueError, match="got float"):
        K.rms_norm(x, 1.0, EPS)
    with pytest.raises(ValueError, match=r"add_rms_norm: weight must be a \[8\] tensor or None"):
        add_rms_norm(x, x, torch.ones(4), EPS)
