"""Gemma4RMSNorm (``x * pow(mean(x^2) + eps, -0.5)``, not rsqrt; ``with_scale=False`` holds no weight) on the
rms_norm drop-in, gemma casting, offset 0: both backends (Triton through the interpreter), fp32 and fp16, forward
and gradients. Measured: the torch path is bit-equal in fp32 (CPU pow(-0.5) rounds as rsqrt), Triton to 1e-5."""

from __future__ import annotations

import pytest
import torch
from transformers.models.gemma4 import modeling_gemma4

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.modules.norm import rms_norm_forward
from liger_registry.schemas import RmsNormSpec

H, EPS = 40, 1e-6
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
# eps_attr: `eps` in transformers 5.17, `variance_epsilon` in 5.25
SPEC = RmsNormSpec(
    targets=["Gemma4RMSNorm"],
    casting_mode="gemma",
    weight_optional=True,
    eps_attr=["variance_epsilon", "eps"],
)


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("with_scale", [True, False], ids=["scale", "no-scale"])
def test_drop_in_on_gemma4_rms_norm(backend, with_scale, dtype):
    g = torch.Generator().manual_seed(0)
    norm = modeling_gemma4.Gemma4RMSNorm(H, eps=EPS, with_scale=with_scale).to(dtype)
    if with_scale:
        with torch.no_grad():
            norm.weight.copy_(torch.randn(H, generator=g))
    x = (torch.randn(2, 7, H, generator=g) * 3).to(dtype).requires_grad_()
    leaves = [x, *norm.parameters()]
    dy = torch.randn(2, 7, H, generator=g).to(dtype)
    ours, ref = rms_norm_forward(SPEC)(norm, x), norm(x)
    exact = backend == "torch" and dtype == torch.float32
    for a, b in zip(
        (ours, *torch.autograd.grad(ours, leaves, dy)),
        (ref, *torch.autograd.grad(ref, leaves, dy)),
        strict=True,
    ):
        assert a.dtype == b.dtype
        tol = 0.0 if exact and a is ours else TOL[dtype] * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=0.0 if tol == 0.0 else TOL[dtype], atol=tol)
