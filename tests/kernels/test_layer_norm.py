"""LayerNorm (kernels/norm): with and without a weight and/or a bias (OlmoLayerNorm: neither, epsilon hard-coded;
CohereLayerNorm: no bias, a [heads, head_dim] weight in its QK norm), LayerNorm1P (nemotron), the partial sums
of the weight gradients; the PyTorch path and Triton (the interpreter on CPU) against PyTorch and the families'
modules, and on CUDA fp32 and bf16 against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cases import (
    GPU_DTYPES,
    check_family,
    close,
    cuda_g,
    cuda_randn,
    g,
    gpu,
    grads,
    leaf,
    norm_kernels,
    norm_step_replays_in_a_cuda_graph,
)
from cases import check64 as _check
from transformers.models.cohere import modeling_cohere
from transformers.models.nemotron import modeling_nemotron
from transformers.models.olmo import modeling_olmo

from liger_registry import kernels as K
from liger_registry.kernels.norm import layer_norm_1p
from liger_registry.modules.norm import layer_norm_1p_forward, layer_norm_forward
from liger_registry.schemas import LayerNormSpec

ROWS, H, EPS = 13, 40, 1e-5  # 13 rows over several backward programs; 40 columns in a 64-wide block
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.float16]


# ---------------------------------------------------------------- the PyTorch path, fp64
def test_layer_norm_torch_path():
    x = torch.randn(5, 12, generator=g(), dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, generator=g(1), dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, generator=g(2), dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(K.layer_norm(x, w, b, 1e-5), F.layer_norm(x, (12,), w, b, 1e-5))
    torch.testing.assert_close(K.layer_norm(x, w, None, 1e-5), F.layer_norm(x, (12,), w, None, 1e-5))


# ---------------------------------------------------------------- Triton through the interpreter
@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_triton(bias):
    x = torch.randn(9, 40, generator=g()).requires_grad_()
    w = torch.randn(40, generator=g(1)).requires_grad_()
    b = torch.randn(40, generator=g(2)).requires_grad_() if bias else None
    y = K.layer_norm(x, w, b, 1e-5)
    ref = F.layer_norm(x, (40,), w, b, 1e-5)
    close(y, ref, 1e-5)
    dy = torch.randn_like(y)
    ins = [x, w] + ([b] if bias else [])
    for a, e in zip(torch.autograd.grad(y, ins, dy), torch.autograd.grad(ref, ins, dy), strict=True):
        close(a, e, 1e-4)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("need", [(True, False), (False, True)], ids=["dw-only", "db-only"])
def test_layer_norm_triton_one_parameter_grad(need):
    """The backward's partials buffer holds only the gradients asked for; the sum kernel writes each one."""
    x = torch.randn(9, 40, generator=g()).requires_grad_()
    w = torch.randn(40, generator=g(1)).requires_grad_(need[0])
    b = torch.randn(40, generator=g(2)).requires_grad_(need[1])
    dy = torch.randn(9, 40, generator=g(3))
    p = w if need[0] else b
    got = torch.autograd.grad(K.layer_norm(x, w, b, 1e-5), [x, p], dy)
    exp = torch.autograd.grad(F.layer_norm(x, (40,), w, b, 1e-5), [x, p], dy)
    for a, e in zip(got, exp, strict=True):
        close(a, e, 1e-4)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_partial_sums_kernel(monkeypatch, dtype):
    """Several partial-row steps and column blocks with a ragged tail; the result is cast to the weight dtype."""
    monkeypatch.setattr(norm_kernels, "SUM_BLOCK_P", 8)
    parts = torch.randn(2, 37, 150, generator=g())
    dw, db = norm_kernels._sum_parts(parts, dtype)
    assert dw.dtype == db.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2**-7  # one bf16 rounding of the fp32 sum (<= half an ulp)
    close(dw, parts[0].sum(0), tol)
    close(db, parts[1].sum(0), tol)
    (only,) = norm_kernels._sum_parts(parts[1:], dtype)
    close(only, parts[1].sum(0), tol)


# ---------------------------------------------------------------- optional weight and bias, both backends
def _x(dtype, shape=(ROWS, H), seed=1):
    """Rows with a stride larger than the row (the middle third of a wider buffer), mean and scale off zero/one."""
    base = torch.randn(*shape[:-1], 3 * shape[-1], generator=g(seed)) * 3 + 0.5
    return base.to(dtype)[..., shape[-1] : 2 * shape[-1]].requires_grad_()


def _param(seed, dtype, shape=(H,)):
    return (torch.randn(*shape, generator=g(seed)) * 0.5 + 1).to(dtype).requires_grad_()


def _fp32_reference(x, weight, bias):
    """F.layer_norm in fp32, rounded once to x's dtype (the kernel's contract, and what Olmo/Cohere compute)."""
    y = F.layer_norm(x.float(), (x.shape[-1],), None, None, EPS)
    y = y if weight is None else y * weight.float()
    return (y if bias is None else y + bias.float()).to(x.dtype)


def _with_grads(y, inputs, seed=2):
    dy = torch.randn(y.shape, generator=g(seed)).to(y.dtype)
    live = [t for t in inputs if t is not None]
    return (y, *torch.autograd.grad(y, live, dy))


def _assert_close(ours, ref, dtype):
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        tol = TOL[dtype] * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=tol, msg=lambda m, i=i: f"tensor {i}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
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


# ---------------------------------------------------------------- LayerNorm1P (nemotron), both backends
ERRORS: dict[str, float] = {}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm_1p_matches_nemotron(backend, dtype):
    norm = modeling_nemotron.NemotronLayerNorm1P(H, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(H, generator=g(0)) * 0.1)
        norm.bias.copy_(torch.randn(H, generator=g(1)) * 0.1)
    x = (torch.randn(2, ROWS, H, generator=g(2)) * 2 + 0.5).to(dtype).requires_grad_()
    ref = norm(x)
    out = layer_norm_1p_forward(norm, x)
    gr = torch.randn(ref.shape, generator=g(3)).to(dtype)
    params = (x, norm.weight, norm.bias)
    ours, theirs = (out, *torch.autograd.grad(out, params, gr)), (ref, *torch.autograd.grad(ref, params, gr))
    tol = 0.0 if backend == "torch" else TOL[dtype]
    key = f"NemotronLayerNorm1P {str(dtype)[6:]}"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        if backend == "triton":
            rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
            ERRORS[key] = max(ERRORS.get(key, 0.0), rel)
        # atol scaled by the largest value: the weight gradient sums many half-precision products
        atol = tol * max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a, b, rtol=tol, atol=atol, msg=lambda m, i=i: f"tensor {i}: {m}")


def test_layer_norm_1p_under_cpu_autocast(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "torch")
    norm = modeling_nemotron.NemotronLayerNorm1P(H)
    x = torch.randn(ROWS, H, generator=g(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = norm(x), layer_norm_1p_forward(norm, x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_zz_print_errors():
    """Prints the largest Triton-vs-family relative error of each case (run with -s)."""
    for key, err in sorted(ERRORS.items()):
        print(f"\n[norm-variant max rel err] {key}: {err:.3g}")


# ---------------------------------------------------------------- CUDA: fp32 and bf16 against float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_layer_norm(dtype):
    gen = cuda_g(4)
    x0 = torch.randn(4099, 3000, device="cuda", generator=gen) + 0.5
    w0, b0 = torch.randn(3000, device="cuda", generator=gen), torch.randn(3000, device="cuda", generator=gen)
    x, w, b = leaf(x0, dtype), leaf(w0, dtype), leaf(b0, dtype)
    y = K.layer_norm(x, w, b, 1e-5)
    x64, w64, b64 = (leaf(t.to(dtype), torch.float64) for t in (x0, w0, b0))
    ref = F.layer_norm(x64, (3000,), w64, b64, 1e-5)
    _check("layer_norm", "y", y, ref, dtype)
    dy = torch.randn_like(x0)
    for name, a, e in zip(
        ["dx", "dw", "db"],
        grads(y, [x, w, b], dy.to(dtype)),
        grads(ref, [x64, w64, b64], dy.double()),
        strict=True,
    ):
        _check("layer_norm", name, a, e, dtype)


@gpu
def test_layer_norm_step_has_no_host_sync():
    norm_step_replays_in_a_cuda_graph("layer_norm")


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_layer_norm_1p(dtype):
    h = 4096

    def family(x, weight, bias):
        norm = modeling_nemotron.NemotronLayerNorm1P(h).to(device="cuda", dtype=torch.float64)
        return torch.func.functional_call(norm, {"weight": weight, "bias": bias}, (x,))

    check_family("layer_norm_1p nemotron", lambda x, weight, bias: layer_norm_1p(x, weight, bias, 1e-5), family,
          [cuda_randn(4096, h, seed=0, scale=2.0), cuda_randn(h, seed=1, scale=0.1), cuda_randn(h, seed=2, scale=0.1)], dtype)  # fmt: skip
