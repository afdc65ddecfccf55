"""RMSNorm (kernels/norm): the PyTorch path bit-equal to HF's norms, Triton (the interpreter on CPU) against the
PyTorch path, without a weight, Gemma4's norm through the drop-in; on CUDA, fp32 and bf16 against float64."""

from __future__ import annotations

import pytest
import torch
from cases import GPU_DTYPES, close, cuda_g, g, gpu, grads, leaf, norm_math, norm_step_replays_in_a_cuda_graph
from cases import check64 as _check
from torch import nn
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.gemma3n import modeling_gemma3n
from transformers.models.gemma4 import modeling_gemma4
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from liger_registry import kernels as K
from liger_registry.kernels.norm import add_rms_norm
from liger_registry.modules.norm import rms_norm_forward
from liger_registry.schemas import RmsNormSpec

ROWS, H, EPS = 13, 40, 1e-6  # 13 rows over several backward programs; 40 columns in a 64-wide block
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.float16]
MODES = ("llama", "gemma", "none")


# ---------------------------------------------------------------- the PyTorch path against HF
def test_rms_norm_llama_is_hf_llama_exactly():
    m = LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        m.weight.copy_(torch.randn(24, generator=g()))
    x = torch.randn(3, 5, 24, generator=g(1))
    assert torch.equal(K.rms_norm(x, m.weight, 1e-5), m(x))
    # bf16 input, fp32 weight (mixed, as HF does it)
    xb = x.bfloat16()
    assert torch.equal(K.rms_norm(xb, m.weight, 1e-5), m(xb))


def test_rms_norm_gemma_is_hf_gemma3_exactly():
    m = Gemma3RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        m.weight.copy_(torch.randn(24, generator=g()) * 0.1)
    for x in (torch.randn(4, 24, generator=g(2)), torch.randn(4, 24, generator=g(2)).bfloat16()):
        assert torch.equal(K.rms_norm(x, m.weight, 1e-6, offset=1.0, casting_mode="gemma"), m(x))


def test_rms_norm_none_and_grads():
    x = torch.randn(6, 16, generator=g(), dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, generator=g(1), dtype=torch.float64, requires_grad=True)
    y = K.rms_norm(x, w, 1e-6, offset=0.5, casting_mode="none")
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (0.5 + w)
    torch.testing.assert_close(y, ref)
    assert torch.autograd.gradcheck(lambda a, b: K.rms_norm(a, b, 1e-6, 0.5, "none"), (x, w))
    with pytest.raises(ValueError, match="casting_mode"):
        K.rms_norm(x, w, 1e-6, casting_mode="bogus")


# ---------------------------------------------------------------- Triton through the interpreter
@pytest.mark.usefixtures("triton_small")
def test_backend_is_triton_on_cpu():
    assert K.backend_for(torch.randn(2), op="rms_norm") == "triton"


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize(
    "mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.5)]
)  # offset: a runtime scalar
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_triton(mode, offset, dtype):
    x = torch.randn(7, 3, 40, generator=g()).to(dtype)[:, 1]  # non-contiguous rows, H not a power of 2
    w = (torch.randn(40, generator=g(1)) * 0.3).to(dtype)
    x.requires_grad_()
    w.requires_grad_()
    y = K.rms_norm(x, w, 1e-6, offset, mode)
    ref = norm_math.rms_norm_torch(x, w, 1e-6, offset, mode)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    if dtype == torch.float32 and mode != "none":
        assert torch.allclose(y, ref, rtol=1e-6, atol=1e-6)
    close(y, ref, tol)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, w], dy)
    exp = torch.autograd.grad(ref, [x, w], dy)
    for a, e in zip(got, exp, strict=True):
        close(a, e, tol * 5)


@pytest.mark.usefixtures("triton_small")
def test_rms_norm_in_place_backward():
    x = torch.randn(6, 24, generator=g()).requires_grad_()
    w = torch.randn(24, generator=g(1)).requires_grad_()
    y = K.rms_norm(x, w, 1e-6, in_place_backward=True)
    dy = torch.randn(6, 24, generator=g(2))
    y.backward(dy.clone())
    ref = norm_math.rms_norm_torch(x, w, 1e-6)
    ex, ew = torch.autograd.grad(ref, [x, w], dy)
    close(x.grad, ex, 1e-5)
    close(w.grad, ew, 1e-5)


# ---------------------------------------------------------------- without a weight, both backends
def _x(dtype, seed=1, scale=3.0):
    """Rows with a stride larger than the row (the middle third of a wider buffer)."""
    return (torch.randn(ROWS, 3 * H, generator=g(seed)) * scale).to(dtype)[:, H : 2 * H].requires_grad_()


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_rms_norm_without_weight(backend, mode, dtype):
    x = _x(dtype)
    y, ref = K.rms_norm(x, None, EPS, casting_mode=mode), _reference(x, mode)
    if backend == "torch" and mode != "none":
        assert torch.equal(y, nn.RMSNorm(H, eps=EPS, elementwise_affine=False)(x))
    dy = torch.randn(y.shape, generator=g(2)).to(dtype)
    _assert_close((y, *torch.autograd.grad(y, x, dy)), (ref, *torch.autograd.grad(ref, x, dy)), dtype)


def test_offset_does_not_apply_without_weight(backend):
    x = _x(torch.float32)
    torch.testing.assert_close(K.rms_norm(x, None, EPS, offset=1.0), K.rms_norm(x, None, EPS), rtol=0, atol=0)


def test_in_place_backward_without_weight(backend):
    x = _x(torch.float32)
    y = K.rms_norm(x, None, EPS, in_place_backward=True)
    dy = torch.randn(y.shape, generator=g(2))
    y.backward(dy.clone())
    (expected,) = torch.autograd.grad(_reference(x, "llama"), x, dy)
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-5)


WEIGHTLESS_NORMS = {
    "nn.RMSNorm(elementwise_affine=False)": (
        lambda: nn.RMSNorm(H, eps=EPS, elementwise_affine=False),
        RmsNormSpec(targets=["RMSNorm"], casting_mode="gemma", eps_attr="eps"),
    ),
    "Gemma3nRMSNorm(with_scale=False)": (  # no weight attribute at all
        lambda: modeling_gemma3n.Gemma3nRMSNorm(H, eps=EPS, with_scale=False),
        RmsNormSpec(targets=["Gemma3nRMSNorm"], casting_mode="gemma", eps_attr=["variance_epsilon", "eps"]),
    ),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(WEIGHTLESS_NORMS))
def test_module_forward_on_a_norm_without_weight(backend, name, dtype):
    make, spec = WEIGHTLESS_NORMS[name]
    norm = make()
    x = _x(dtype)
    ours, ref = rms_norm_forward(spec)(norm, x), norm(x)
    dy = torch.randn(ref.shape, generator=g(2)).to(dtype)
    _assert_close((ours, *torch.autograd.grad(ours, x, dy)), (ref, *torch.autograd.grad(ref, x, dy)), dtype)


def test_rejects_a_weight_of_the_wrong_shape_or_type():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must be a \[8\] tensor or None"):
        K.rms_norm(x, torch.ones(4), EPS)
    with pytest.raises(ValueError, match="got float"):
        K.rms_norm(x, 1.0, EPS)
    with pytest.raises(ValueError, match=r"add_rms_norm: weight must be a \[8\] tensor or None"):
        add_rms_norm(x, x, torch.ones(4), EPS)


# ---------------------------------------------------------------- Gemma4RMSNorm through the drop-in
# ``x * pow(mean(x^2) + eps, -0.5)``, not rsqrt; ``with_scale=False`` holds no weight. The torch path is
# bit-equal in fp32 (CPU pow(-0.5) rounds as rsqrt), Triton to 1e-5.
# eps_attr: `eps` in transformers 5.17, `variance_epsilon` in 5.25
GEMMA4_SPEC = RmsNormSpec(
    targets=["Gemma4RMSNorm"],
    casting_mode="gemma",
    weight_optional=True,
    eps_attr=["variance_epsilon", "eps"],
)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_scale", [True, False], ids=["scale", "no-scale"])
def test_drop_in_on_gemma4_rms_norm(backend, with_scale, dtype):
    gen = g(0)
    norm = modeling_gemma4.Gemma4RMSNorm(H, eps=EPS, with_scale=with_scale).to(dtype)
    if with_scale:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(H, generator=gen))
    x = (torch.randn(2, 7, H, generator=gen) * 3).to(dtype).requires_grad_()
    leaves = [x, *norm.parameters()]
    dy = torch.randn(2, 7, H, generator=gen).to(dtype)
    ours, ref = rms_norm_forward(GEMMA4_SPEC)(norm, x), norm(x)
    exact = backend == "torch" and dtype == torch.float32
    for a, b in zip(
        (ours, *torch.autograd.grad(ours, leaves, dy)),
        (ref, *torch.autograd.grad(ref, leaves, dy)),
        strict=True,
    ):
        assert a.dtype == b.dtype
        tol = 0.0 if exact and a is ours else TOL[dtype] * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=0.0 if tol == 0.0 else TOL[dtype], atol=tol)


# ---------------------------------------------------------------- CUDA: fp32 and bf16 against float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
def test_rms_norm(dtype, mode, offset):
    gen = cuda_g(3)
    x0 = torch.randn(4099, 4096, device="cuda", generator=gen)
    w0 = torch.randn(4096, device="cuda", generator=gen) * 0.1 + (0.0 if offset else 1.0)
    x, w = leaf(x0, dtype), leaf(w0, dtype)
    y = K.rms_norm(x, w, 1e-6, offset, mode)
    x64, w64 = leaf(x0.to(dtype), torch.float64), leaf(w0.to(dtype), torch.float64)
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * (offset + w64)
    case = f"rms_norm {mode}"
    _check(case, "y", y, ref, dtype)
    dy = torch.randn_like(x0)
    for name, a, e in zip(
        ["dx", "dw"], grads(y, [x, w], dy.to(y.dtype)), grads(ref, [x64, w64], dy.double()), strict=True
    ):
        _check(case, name, a, e, dtype)


@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
def test_rms_norm_cuda_without_weight(dtype, mode):
    """``weight=None`` (no elementwise affine): ``x / rms(x)``, dx; and the fused add + RMSNorm without a weight."""
    gen = cuda_g(13)
    x0 = torch.randn(4099, 4096, device="cuda", generator=gen)
    x = leaf(x0, dtype)
    y = K.rms_norm(x, None, 1e-6, casting_mode=mode)
    assert y.dtype == dtype
    x64 = leaf(x0.to(dtype), torch.float64)
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    case = f"rms_norm {mode} no weight"
    _check(case, "y", y, ref, dtype)
    dy = torch.randn_like(x0)
    _check(case, "dx", *grads(y, [x], dy.to(dtype)), *grads(ref, [x64], dy.double()), dtype)
    if mode == "none":
        return
    r0 = torch.randn(4099, 4096, device="cuda", generator=gen)
    x, r = leaf(x0, dtype), leaf(r0, dtype)
    s, y = K.add_rms_norm(x, r, None, 1e-6, casting_mode=mode)
    x64, r64 = leaf(x0.to(dtype), torch.float64), leaf(r0.to(dtype), torch.float64)
    s64 = r64 + x64
    ref = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6)
    case = f"add_rms_norm {mode} no weight"
    _check(case, "y", y, ref, dtype)
    got = grads((s, y), [x, r], (dy.to(dtype), dy.to(dtype)))
    exp = grads((s64, ref), [x64, r64], (dy.double(), dy.double()))
    for name, a, e in zip(["dx", "dresidual"], got, exp, strict=True):
        _check(case, name, a, e, dtype)


@gpu
def test_rms_norm_step_has_no_host_sync():
    norm_step_replays_in_a_cuda_graph("rms_norm")
