"""Fused residual add + RMSNorm vs the families' add-then-norm, and LayerNorm1P vs nemotron's: torch path
bit-equal, Triton (interpreter) to tight tolerance, forward and every gradient."""

from __future__ import annotations

import pytest
import torch
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama
from transformers.models.nemotron import modeling_nemotron
from transformers.models.qwen3_next import modeling_qwen3_next

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.norm import add_rms_norm
from liger_registry.modules.norm import layer_norm_1p_forward

ROWS, H = 13, 40  # 13 rows over 4 backward programs (a ragged last one); 40 columns in a 64-wide block
ERRORS: dict[str, float] = {}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _compare(key, backend, ours, ref, dtype):
    tol = 0.0 if backend == "torch" else TOL[dtype]
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        if backend == "triton":
            rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
            ERRORS[key] = max(ERRORS.get(key, 0.0), rel)
        # atol scaled by the largest value: the weight gradient sums many half-precision products
        atol = tol * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=tol, atol=atol, msg=lambda m, i=i: f"tensor {i}: {m}")


NORMS = [
    (lambda: modeling_llama.LlamaRMSNorm(H, eps=1e-6), 0.0, "llama"),
    (lambda: modeling_gemma3.Gemma3RMSNorm(H, eps=1e-6), 1.0, "gemma"),
    (lambda: modeling_qwen3_next.Qwen3NextRMSNorm(H, eps=1e-6), 1.0, "gemma"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("make,offset,mode", NORMS, ids=["LlamaRMSNorm", "Gemma3RMSNorm", "Qwen3NextRMSNorm"])
def test_add_rms_norm_matches_add_then_family_norm(backend, make, offset, mode, dtype):
    norm = make().to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H, generator=_g(0)) * 0.5)
    x = torch.randn(2, ROWS, H, generator=_g(1)).to(dtype).requires_grad_()
    residual = (torch.randn(2, ROWS, H, generator=_g(2)) * 3).to(dtype).requires_grad_()
    ref_s = residual + x
    ref_y = norm(ref_s)
    s, y = add_rms_norm(
        x, residual, norm.weight, norm.variance_epsilon if mode == "llama" else norm.eps, offset, mode
    )
    gs, gy = torch.randn(s.shape, generator=_g(3)).to(dtype), torch.randn(y.shape, generator=_g(4)).to(dtype)
    inputs = (x, residual, norm.weight)
    ref_grads = torch.autograd.grad((ref_s, ref_y), inputs, (gs, gy))
    grads = torch.autograd.grad((s, y), inputs, (gs, gy))
    _compare(
        f"add+{type(norm).__name__} {str(dtype)[6:]}",
        backend,
        (s, y, *grads),
        (ref_s, ref_y, *ref_grads),
        dtype,
    )


def test_add_rms_norm_one_output_used(backend):
    """Only the normalised output reaches the loss (a last layer), then only the sum (a norm skipped)."""
    norm = modeling_llama.LlamaRMSNorm(H)
    x = torch.randn(ROWS, H, generator=_g(1)).requires_grad_()
    residual = torch.randn(ROWS, H, generator=_g(2)).requires_grad_()
    for pick in (0, 1):
        ref = (residual + x, norm(residual + x))[pick]
        out = add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)[pick]
        g = torch.randn(ref.shape, generator=_g(5))
        ref_grads = torch.autograd.grad(ref, (x, residual, norm.weight), g, allow_unused=True)
        grads = torch.autograd.grad(out, (x, residual, norm.weight), g, allow_unused=True)
        if pick == 0:  # the weight is unused: no gradient (None) or a zero one
            assert grads[2] is None or not grads[2].any()
            ref_grads, grads = ref_grads[:2], grads[:2]
        _compare("add+LlamaRMSNorm one output", backend, grads, ref_grads, torch.float32)


def test_add_rms_norm_rejects_bad_inputs():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="casting_mode"):
        add_rms_norm(x, x, torch.ones(8), 1e-6, casting_mode="none")
    with pytest.raises(ValueError, match="differ"):
        add_rms_norm(x, torch.randn(3, 8), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm(x, x, torch.ones(4), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_layer_norm_1p_matches_nemotron(backend, dtype):
    norm = modeling_nemotron.NemotronLayerNorm1P(H, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H, generator=_g(0)) * 0.1)
        norm.bias.copy_(torch.randn(H, generator=_g(1)) * 0.1)
    x = (torch.randn(2, ROWS, H, generator=_g(2)) * 2 + 0.5).to(dtype).requires_grad_()
    ref = norm(x)
    out = layer_norm_1p_forward(norm, x)
    g = torch.randn(ref.shape, generator=_g(3)).to(dtype)
    params = (x, norm.weight, norm.bias)
    _compare(
        f"NemotronLayerNorm1P {str(dtype)[6:]}",
        backend,
        (out, *torch.autograd.grad(out, params, g)),
        (ref, *torch.autograd.grad(ref, params, g)),
        dtype,
    )


def test_layer_norm_1p_under_cpu_autocast(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "torch")
    norm = modeling_nemotron.NemotronLayerNorm1P(H)
    x = torch.randn(ROWS, H, generator=_g(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = norm(x), layer_norm_1p_forward(norm, x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_zz_print_errors():
    """Prints the largest Triton-vs-family relative error of each case (run with -s)."""
    for key, err in sorted(ERRORS.items()):
        print(f"\n[norm-variant max rel err] {key}: {err:.3g}")
