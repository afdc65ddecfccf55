"""LayerNorm without a weight and/or a bias (OlmoLayerNorm: neither, epsilon hard-coded; CohereLayerNorm: no bias,
and a [heads, head_dim] weight in its QK norm) against PyTorch references, on both backends (Triton through the
interpreter), fp32 and fp16, forward and the gradients; and the module drop-in on the families' own modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.cohere import modeling_cohere
from transformers.models.olmo import modeling_olmo

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.modules.norm import layer_norm_forward
from liger_registry.schemas import LayerNormSpec

ROWS, H, EPS = 13, 40, 1e-5  # 13 rows over several backward programs; 40 columns in a 64-wide block
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _x(dtype, shape=(ROWS, H), seed=1):
    """Rows with a stride larger than the row (the middle third of a wider buffer), mean and scale off zero/one."""
    base = torch.randn(*shape[:-1], 3 * shape[-1], generator=_g(seed)) * 3 + 0.5
    return base.to(dtype)[..., shape[-1] : 2 * shape[-1]].requires_grad_()


def _param(seed, dtype, shape=(H,)):
    return (torch.randn(*shape, generator=_g(seed)) * 0.5 + 1).to(dtype).requires_grad_()


def _fp32_reference(x, weight, bias):
    """F.layer_norm in fp32, rounded once to x's dtype (the kernel's contract, and what Olmo/Cohere compute)."""
    y = F.layer_norm(x.float(), (x.shape[-1],), None, None, EPS)
    y = y if weight is None else y * weight.float()
    return (y if bias is None else y + bias.float()).to(x.dtype)


def _with_grads(y, inputs, seed=2):
    dy = torch.randn(y.shape, generator=_g(seed)).to(y.dtype)
    live = [t for t in inputs if t is not None]
    return (y, *torch.autograd.grad(y, live, dy))


def _assert_close(ours, ref, dtype):
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        tol = TOL[dtype] * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=tol, msg=lambda m, i=i: f"tensor {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_layer_norm_with_optional_weight_and_bias(backend, affine, dtype):
    x = _x(dtype)
    weight = _param(3, dtype) if affine != "none" else None
    bias = _param(4, dtype) if affine == "weight+bias" else None
    ours = _with_grads(K.layer_norm(x, weight, bias, EPS), (x, weight, bias))
    ref = _with_grads(_fp32_reference(x, weight, bias), (x, weight, bias))
    _assert_close(ours, ref, dtype)


def test_layer_norm_rejects_a_bias_without_weight_and_bad_shapes():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="a bias without a weight"):
        K.layer_norm(x, None, torch.zeros(8), EPS)
    with pytest.raises(ValueError, match=r"layer_norm: bias must be a \[8\] tensor or None"):
        K.layer_norm(x, torch.ones(8), torch.zeros(4), EPS)
    with pytest.raises(ValueError, match=r"layer_norm: weight must be a \[8\] tensor or None"):
        K.layer_norm(x, torch.ones(2, 8), None, EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_drop_in_on_olmo_layer_norm(backend, dtype):
    """No weight, no bias, no epsilon attribute: ``eps`` from the spec (Olmo hard-codes 1e-5)."""
    norm = modeling_olmo.OlmoLayerNorm(H)
    spec = LayerNormSpec(targets=["OlmoLayerNorm"], eps=1e-5)
    x = _x(dtype, (2, 7, H))
    _assert_close(_with_grads(layer_norm_forward(spec)(norm, x), (x,)), _with_grads(norm(x), (x,)), dtype)


COHERE = {  # normalised shape, x's shape
    "hidden": ((H,), (2, 7, H)),
    "qk-norm": ((3, 16), (2, 7, 3, 16)),  # use_qk_norm: [heads, head_dim], each head normalised over head_dim
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(COHERE))
def test_drop_in_on_cohere_layer_norm(backend, name, dtype):
    shape, x_shape = COHERE[name]
    norm = modeling_cohere.CohereLayerNorm(shape, eps=EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(_param(3, dtype, shape))
    spec = LayerNormSpec(targets=["CohereLayerNorm"], eps_attr="variance_epsilon", broadcast_weight=True)
    x = _x(dtype, x_shape)
    ours = _with_grads(layer_norm_forward(spec)(norm, x), (x, norm.weight))
    ref = _with_grads(norm(x), (x, norm.weight))
    _assert_close(ours, ref, dtype)


def test_a_wider_weight_needs_broadcast_weight():
    """Without the option a [heads, head_dim] weight is refused, not read as another norm's."""
    norm = modeling_cohere.CohereLayerNorm((3, 16), eps=EPS)
    spec = LayerNormSpec(targets=["CohereLayerNorm"], eps_attr="variance_epsilon")
    with pytest.raises(ValueError, match="weight must be a"):
        layer_norm_forward(spec)(norm, torch.randn(2, 7, 3, 16))
