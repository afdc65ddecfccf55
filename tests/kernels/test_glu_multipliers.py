"""SwiGLU / GeGLU with Falcon-H1's gate and down multipliers (``config.mlp_multipliers``) on both backends (Triton
through the interpreter): the MLP drop-in against ``FalconH1MLP`` (torch path bit-equal, Triton to tight
tolerance, forward and every gradient), the rounding points in fp16 bit for bit, and the op against a PyTorch
reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_refs import ulp_distance
from transformers.models.falcon_h1 import modeling_falcon_h1
from transformers.models.falcon_h1.configuration_falcon_h1 import FalconH1Config

from liger_registry import kernels as K
from liger_registry.kernels import glu
from liger_registry.modules.glu import swiglu_forward
from liger_registry.registry import load_registry
from liger_registry.schemas import GluSpec

H, INTER = 24, 40  # with the Triton block lowered to 16, 40 columns are 3 blocks, the last masked
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
MULTIPLIERS = [(0.7, 1.3), (1.0, 1.0), (2.5, 1.0), (1.0, 0.25)]


@pytest.fixture
def backend(glu_backend):
    return glu_backend


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _dtypes(backend):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if backend == "torch" else [])


def _falcon_mlp(multipliers, bias, dtype):
    config = FalconH1Config(
        hidden_size=H, intermediate_size=INTER, mlp_multipliers=list(multipliers), mlp_bias=bias
    )
    torch.manual_seed(0)
    return modeling_falcon_h1.FalconH1MLP(config).to(dtype)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("multipliers", MULTIPLIERS, ids=str)
def test_swiglu_forward_matches_falcon_h1_mlp(backend, multipliers, bias):
    forward = swiglu_forward(GluSpec(targets=["FalconH1MLP"]))
    for dtype in _dtypes(backend):
        mlp = _falcon_mlp(multipliers, bias, dtype)
        x = torch.randn(2, 3, H, generator=_g(1)).to(dtype).requires_grad_()
        ref, out = mlp(x), forward(mlp, x)
        g = torch.randn(ref.shape, generator=_g(2)).to(dtype)
        params = [x, *mlp.parameters()]
        ref_all = (ref, *torch.autograd.grad(ref, params, g))
        out_all = (out, *torch.autograd.grad(out, params, g))
        for i, (a, b) in enumerate(zip(out_all, ref_all, strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, i
            if backend == "torch":
                assert torch.equal(a, b), f"{dtype} tensor {i}"
            else:  # relative to the largest value: the weight gradients sum many half-precision products
                rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                assert rel <= TOL[dtype], f"{dtype} tensor {i}: rel err {rel:.3g}"


def test_falcon_h1_family_installs_swiglu():
    entry = load_registry().family("falcon_h1").entry
    assert entry.kernels.swiglu.enabled and entry.kernels.swiglu.targets == ["FalconH1MLP"]


# ---------------------------------------------------------------- rounding points (fp16, bit for bit)
ROWS, COLS = 8, 1000
MAX_ULPS, MAX_DIFFERING = 1, 2e-3  # as test_glu_rounding.py: Triton's fp32 activation may flip a rounding


def _assert_bits_close(backend, ours, ref):
    assert ours.dtype == ref.dtype == torch.float16 and ours.shape == ref.shape
    d = ulp_distance(ours, ref)
    if backend == "torch":
        assert int(d.max()) == 0, f"{int((d > 0).sum())} elements differ"
        return
    differing = (d > 0).float().mean().item()
    assert int(d.max()) <= MAX_ULPS and differing <= MAX_DIFFERING, f"{int(d.max())} ulps, {differing:.2%}"


@pytest.mark.parametrize("gate_multiplier,down_multiplier", [(0.7, 1.0), (3.0, 0.3)])
def test_multipliers_round_as_falcon_h1(backend, gate_multiplier, down_multiplier, monkeypatch):
    """``up * silu(gate * m)`` (FalconH1MLP.forward), each op rounding to fp16, then ``* down``; and d up."""
    from liger_registry.kernels.glu import triton_kernels

    monkeypatch.setattr(triton_kernels, "BLOCK", 256)
    gate = (torch.randn(ROWS, COLS, generator=_g(0)) * 3).half()
    up = (torch.randn(ROWS, COLS, generator=_g(1)) * 4).half()
    dy = torch.randn(ROWS, COLS, generator=_g(2)).half()

    def falcon(g, u):
        return (u * F.silu(g * gate_multiplier)) * down_multiplier

    def ours(g, u):
        return K.swiglu(g, u, gate_multiplier=gate_multiplier, down_multiplier=down_multiplier)

    outs, d_ups = [], []
    for fn in (falcon, ours):
        u = up.clone().requires_grad_()
        out = fn(gate, u)
        outs.append(out)
        d_ups.append(torch.autograd.grad(out, u, dy)[0])
    _assert_bits_close(backend, outs[1], outs[0])
    # a down multiplier's eager gradient rounds once more (dy * m) than the kernel's
    if down_multiplier == 1.0:
        _assert_bits_close(backend, d_ups[1], d_ups[0])


# ---------------------------------------------------------------- the op against a PyTorch reference
def _reference(kind, gate, up, gate_multiplier, down_multiplier):
    g = gate.double() * gate_multiplier
    act = F.silu(g) if kind == "swiglu" else F.gelu(g, approximate="tanh")
    return act * up.double() * down_multiplier


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_glu_with_multipliers_matches_reference(backend, kind, dtype):
    gm, dm = 0.8, 1.7
    gate = (torch.randn(3, 5, INTER, generator=_g(3)) * 2).to(dtype).requires_grad_()
    up = torch.randn(3, 5, INTER, generator=_g(4)).to(dtype).requires_grad_()
    out = getattr(glu, kind)(gate, up, gate_multiplier=gm, down_multiplier=dm)
    ref = _reference(kind, gate, up, gm, dm)
    assert out.dtype == dtype
    dy = torch.randn(out.shape, generator=_g(5)).to(dtype)
    got = (out, *torch.autograd.grad(out, (gate, up), dy))
    expected = (ref, *torch.autograd.grad(ref, (gate, up), dy.double()))
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), e.double(), rtol=TOL[dtype], atol=TOL[dtype] * 4)


def test_rejects_bad_multipliers():
    x = torch.randn(2, 4)
    for bad in (float("nan"), float("inf"), True, "2", torch.tensor(2.0)):
        with pytest.raises(ValueError, match="gate_multiplier must be a finite number"):
            glu.swiglu(x, x, gate_multiplier=bad)
    with pytest.raises(ValueError, match="down_multiplier must be a finite number"):
        glu.geglu(x, x, down_multiplier=None)
