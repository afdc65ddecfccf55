"""SwiGLU and GeGLU (kernels/glu: ``act(gate * m) * up * d``) on both backends (Triton through the interpreter on
CPU, its column block lowered so small tensors span several blocks): the PyTorch path's gradients (gradcheck),
Triton against it, the in-place backward, Falcon-H1's multipliers (the MLP drop-in bit-equal on the torch path),
the rounding points of the transformers code they replace (fp16, bit for bit); on CUDA, fp32 and bf16 against
float64 and bf16 bits against transformers' MLPs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cases import (
    GPU_DTYPES,
    bits_check,
    close,
    cuda_g,
    glu_kernels,
    glu_math,
    gpu,
    grads,
    leaf,
    ulp_distance,
)
from cases import check64 as _check
from cases import g as _g
from transformers.activations import ACT2FN
from transformers.models.falcon_h1 import modeling_falcon_h1
from transformers.models.falcon_h1.configuration_falcon_h1 import FalconH1Config
from transformers.models.gemma import modeling_gemma
from transformers.models.gemma.configuration_gemma import GemmaConfig
from transformers.models.llama import modeling_llama
from transformers.models.llama.configuration_llama import LlamaConfig

from liger_registry import kernels as K
from liger_registry.kernels import glu
from liger_registry.modules.glu import swiglu_forward
from liger_registry.registry import load_registry
from liger_registry.schemas import GluSpec

H, INTER = 24, 40  # with the Triton block lowered to 16, 40 columns are 3 blocks, the last masked
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}
DTYPE = torch.float16  # of the rounding checks
ROWS, COLS = 8, 1000  # 1000 columns: several Triton blocks of 256, the last one masked
# the Triton path may differ from torch's own fp32 activation in its last fp32 bit, which flips an fp16
# rounding now and then (1 ulp): the rounding placement itself leaves the bits equal. Rounding once instead
# (the old kernels) differs on about a quarter of the elements.
MAX_ULPS = 1
MAX_DIFFERING = 2e-3


@pytest.fixture
def backend(glu_backend):
    return glu_backend


@pytest.fixture
def wide_glu_block(backend, monkeypatch):
    """The rounding checks' 1000 columns in blocks of 256 (the default's 16 would take 63 programs a row)."""
    monkeypatch.setattr(glu_kernels, "BLOCK", 256)


def _dtypes(backend):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if backend == "torch" else [])


def _assert_bits_close(key, backend, ours, ref):
    assert ours.dtype == ref.dtype == DTYPE and ours.shape == ref.shape
    d = ulp_distance(ours, ref)
    if backend == "torch":  # op for op what the family code runs: the same bits
        assert int(d.max()) == 0, f"{key}: {int((d > 0).sum())} elements differ"
        return
    differing = (d > 0).float().mean().item()
    assert int(d.max()) <= MAX_ULPS and differing <= MAX_DIFFERING, (
        f"{key}: max {int(d.max())} ulps, {differing:.2%} of the elements differ"
    )


# ---------------------------------------------------------------- the PyTorch path, fp64
@pytest.mark.parametrize(
    "name,fn",
    [("swiglu", lambda a, b: F.silu(a) * b), ("geglu", lambda a, b: F.gelu(a, approximate="tanh") * b)],
)
def test_glu_torch_path(name, fn):
    a = torch.randn(5, 33, generator=_g(), dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 33, generator=_g(1), dtype=torch.float64, requires_grad=True)
    op = getattr(K, name)
    torch.testing.assert_close(op(a, b), fn(a, b))
    assert torch.autograd.gradcheck(op, (a, b))


# ---------------------------------------------------------------- Triton through the interpreter
@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_glu_triton(name, dtype):
    a = (torch.randn(3, 1500, generator=_g()) * 3).to(dtype).requires_grad_()  # 4500 = not a multiple of 1024
    b = torch.randn(3, 1500, generator=_g(1)).to(dtype).requires_grad_()
    torch_fn = getattr(glu_math, f"{name}_torch")
    y, ref = getattr(K, name)(a, b), torch_fn(a, b)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    close(y, ref, tol)
    dy = torch.randn_like(y)
    for x, e in zip(torch.autograd.grad(y, [a, b], dy), torch.autograd.grad(ref, [a, b], dy), strict=True):
        close(x, e, tol * 2)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu_in_place_backward_writes_the_gradients_over_gate_and_up(name):
    x = torch.randn(4, 40, generator=_g()).requires_grad_()
    w_gate, w_up = torch.randn(40, 40, generator=_g(1)), torch.randn(40, 40, generator=_g(2))
    gate, up = x @ w_gate, x @ w_up  # an MLP's projections: made for the kernel alone
    before = gate.detach().clone(), up.detach().clone()
    y = getattr(K, name)(gate, up, gate_multiplier=0.5, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(3))
    got = torch.autograd.grad(y, [gate, up], dy, retain_graph=True)
    ref_gate, ref_up = (t.clone().requires_grad_() for t in before)
    ref = getattr(glu_math, f"{name}_torch")(ref_gate, ref_up, 0.5)
    want = torch.autograd.grad(ref, [ref_gate, ref_up], dy)
    for a, e in zip(got, want, strict=True):
        close(a, e, 1e-5)
    assert got[0].data_ptr() == gate.data_ptr() and got[1].data_ptr() == up.data_ptr()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, [gate, up], dy)  # the saved activations are gone: a second backward refuses


@pytest.mark.usefixtures("triton_small")
def test_glu_in_place_backward_never_writes_over_a_leaf():
    gate = torch.randn(4, 40, generator=_g()).requires_grad_()
    up = torch.randn(4, 40, generator=_g(1)).requires_grad_()
    before = gate.detach().clone(), up.detach().clone()
    y = K.swiglu(gate, up, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(2))
    y.backward(dy)
    assert torch.equal(gate.detach(), before[0]) and torch.equal(up.detach(), before[1])
    ref = [t.clone().requires_grad_() for t in before]
    want = torch.autograd.grad(glu_math.swiglu_torch(*ref), ref, dy)
    close(gate.grad, want[0], 1e-5)
    close(up.grad, want[1], 1e-5)


@pytest.mark.usefixtures("triton_small")
@pytest.mark.parametrize("layout", ["same tensor", "strided halves"])
def test_glu_in_place_backward_of_shared_or_strided_inputs_is_out_of_place(layout):
    x = torch.randn(4, 80, generator=_g()).requires_grad_()
    proj = x * 2.0  # the kernel's inputs are made from it
    gate, up = (proj, proj) if layout == "same tensor" else (proj[:, :40], proj[:, 40:])
    y = K.swiglu(gate, up, in_place_backward=True)
    dy = torch.randn(y.shape, generator=_g(1))
    got = torch.autograd.grad(y, [x], dy)[0]
    ref_x = x.detach().clone().requires_grad_()
    ref_proj = ref_x * 2.0
    ref_gate, ref_up = (
        (ref_proj, ref_proj) if layout == "same tensor" else (ref_proj[:, :40], ref_proj[:, 40:])
    )
    want = torch.autograd.grad(glu_math.swiglu_torch(ref_gate, ref_up), [ref_x], dy)[0]
    close(got, want, 1e-5)


@pytest.mark.usefixtures("triton_small")
def test_forced_triton_refuses_with_reasons():
    with pytest.raises(K.BackendError, match="dtype float64 not supported"):
        K.swiglu(torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))


# ---------------------------------------------------------------- Falcon-H1's multipliers, both backends
MULTIPLIERS = [(0.7, 1.3), (1.0, 1.0), (2.5, 1.0), (1.0, 0.25)]


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


# ---------------------------------------------------------------- multipliers' rounding points (fp16)
@pytest.mark.parametrize("gate_multiplier,down_multiplier", [(0.7, 1.0), (3.0, 0.3)])
def test_multipliers_round_as_falcon_h1(backend, wide_glu_block, gate_multiplier, down_multiplier):
    """``up * silu(gate * m)`` (FalconH1MLP.forward), each op rounding to fp16, then ``* down``; and d up."""
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
    _assert_bits_close("multipliers forward", backend, outs[1], outs[0])
    # a down multiplier's eager gradient rounds once more (dy * m) than the kernel's
    if down_multiplier == 1.0:
        _assert_bits_close("multipliers d up", backend, d_ups[1], d_ups[0])


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


# ---------------------------------------------------------------- rounding as transformers rounds (fp16)
def _gate(act: str):
    gate = torch.randn(ROWS, COLS, generator=_g(0)) * 3
    if "gelu" in act:
        # below -3, torch's own 0.5 * x * (1 + tanh(.)) cancels: its last bits there are those of its tanh
        # implementation (a CPU vector library here, CUDA's tanhf on the GPU), not of where it rounds
        gate = gate.clamp(min=-3.0)
    return gate.to(DTYPE)


def _up():
    return (torch.randn(ROWS, COLS, generator=_g(1)) * 4).to(DTYPE)


def _up_grad(ref_fn, our_fn, gate, up):
    """d up of both for one upstream gradient: autograd of the family code and of our kernel."""
    dy = torch.randn(ROWS, COLS, generator=_g(2)).to(DTYPE)
    grads = []
    for fn in (ref_fn, our_fn):
        u = up.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(gate, u), u, dy)
        grads.append(g)
    return grads


GLUS = [("swiglu", "silu", K.swiglu), ("geglu", "gelu_pytorch_tanh", K.geglu)]


@pytest.mark.parametrize("name,act,kernel", GLUS, ids=[glu[0] for glu in GLUS])
def test_glu_rounds_as_the_mlp_it_replaces(backend, wide_glu_block, name, act, kernel):
    """LlamaMLP (silu) / GemmaMLP (gelu_pytorch_tanh): ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""
    act_fn = ACT2FN[act]
    gate, up = _gate(act), _up()

    def family(g, u):
        return act_fn(g) * u

    _assert_bits_close(f"{name} forward", backend, kernel(gate, up), family(gate, up))
    ref_du, our_du = _up_grad(family, kernel, gate, up)
    _assert_bits_close(f"{name} d up", backend, our_du, ref_du)


def test_ulp_distance():
    a = torch.tensor([1.0, -1.0, 0.0, -0.0, 65504.0], dtype=DTYPE)
    step = torch.tensor([1.0009765625, -1.0009765625, 6e-8, 6e-8, 65504.0], dtype=DTYPE)
    assert ulp_distance(a, step).tolist() == [1, 1, 1, 1, 0]
    assert ulp_distance(torch.tensor([-6e-8], dtype=DTYPE), torch.tensor([6e-8], dtype=DTYPE)).item() == 2


@pytest.mark.parametrize("kind,act", [(0, "silu"), (1, "gelu_pytorch_tanh")])
def test_glu_op_torch_backward_is_the_gradient_of_the_rounded_forward(kind, act):
    """The custom op's PyTorch backward (what a direct torch.ops call with backend "torch" runs): d up is dy times
    the activation rounded as the forward rounds it."""
    gate, up = _gate(act), _up().requires_grad_()
    dy = torch.randn(ROWS, COLS, generator=_g(2)).to(DTYPE)
    (ours,) = torch.autograd.grad(torch.ops.liger_registry.glu_fwd(gate, up, kind, 1.0, 1.0, "torch"), up, dy)
    (ref,) = torch.autograd.grad(ACT2FN[act](gate) * up, up, dy)
    _assert_bits_close("glu op d up", "torch", ours, ref)


# ---------------------------------------------------------------- CUDA: fp32 and bf16 against float64
@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu(dtype, name):
    gen = cuda_g(6)
    a0 = torch.randn(1025, 14336, device="cuda", generator=gen) * 2
    b0 = torch.randn(1025, 14336, device="cuda", generator=gen)
    a, b = leaf(a0, dtype), leaf(b0, dtype)
    y = getattr(K, name)(a, b)
    a64, b64 = leaf(a0.to(dtype), torch.float64), leaf(b0.to(dtype), torch.float64)
    ref = getattr(glu_math, f"{name}_torch")(a64, b64)
    _check(name, "y", y, ref, dtype)
    dy = torch.randn_like(a0)
    for n_, x_, e_ in zip(
        ["da", "db"], grads(y, [a, b], dy.to(dtype)), grads(ref, [a64, b64], dy.double()), strict=True
    ):
        _check(name, n_, x_, e_, dtype)


@gpu
@pytest.mark.parametrize("name,act", [("swiglu", "silu"), ("geglu", "gelu_pytorch_tanh")])
def test_glu_bf16_bits_as_transformers(name, act):
    """``act_fn(gate) * up`` as LlamaMLP / GemmaMLP compute it in bf16: forward and d up."""
    gen = cuda_g(6)
    gate = torch.randn(1025, 14336, device="cuda", generator=gen) * 3
    if "gelu" in act:  # below -3 torch's own 1 + tanh(.) cancels: its last bits are those of CUDA's tanhf
        gate = gate.clamp(min=-3.0)
    gate = gate.bfloat16()
    up = (torch.randn(1025, 14336, device="cuda", generator=gen) * 4).bfloat16()
    dy = torch.randn(1025, 14336, device="cuda", generator=gen).bfloat16()
    outs, d_ups = [], []
    for fn in (lambda a, b: ACT2FN[act](a) * b, getattr(K, name)):
        u = up.clone().requires_grad_()
        out = fn(gate, u)
        outs.append(out)
        d_ups.append(torch.autograd.grad(out, u, dy)[0])
    bits_check(f"{name} forward", outs[1], outs[0])
    bits_check(f"{name} d up", d_ups[1], d_ups[0])


@gpu
@pytest.mark.parametrize(
    "mlp_cls,config_cls,act,name",
    [
        (modeling_llama.LlamaMLP, LlamaConfig, "silu", "swiglu"),
        (modeling_gemma.GemmaMLP, GemmaConfig, "gelu_pytorch_tanh", "geglu"),
    ],
    ids=["llama", "gemma"],
)
def test_glu_mlp_bf16_as_unpatched(mlp_cls, config_cls, act, name):
    """The whole bf16 MLP: the patched forward's output against the unpatched module's, bit for bit but for the
    rare 1-ulp activation flips (each moves one term of a down_proj dot product by one bf16 ulp)."""
    config = config_cls(hidden_size=2048, intermediate_size=8192, hidden_act=act)
    torch.manual_seed(0)
    mlp = mlp_cls(config).to("cuda", torch.bfloat16)
    x = torch.randn(2048, 2048, device="cuda", generator=cuda_g(7))
    x = x.bfloat16()
    with torch.no_grad():
        ref = mlp(x)
        ours = mlp.down_proj(getattr(K, name)(mlp.gate_proj(x), mlp.up_proj(x)))
    bits_check(f"{mlp_cls.__name__} output", ours, ref, max_ulps=8, max_differing=0.05)


@gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu_multipliers(dtype, name):
    """Falcon-H1's ``mlp_multipliers``: ``act(gate * 0.7) * up * 1.3``."""
    gen = cuda_g(14)
    a0 = torch.randn(1025, 14336, device="cuda", generator=gen) * 2
    b0 = torch.randn(1025, 14336, device="cuda", generator=gen)
    a, b = leaf(a0, dtype), leaf(b0, dtype)
    y = getattr(K, name)(a, b, gate_multiplier=0.7, down_multiplier=1.3)
    a64, b64 = leaf(a0.to(dtype), torch.float64), leaf(b0.to(dtype), torch.float64)
    ref = getattr(glu_math, f"{name}_torch")(a64, b64, 0.7, 1.3)
    case = f"{name} multipliers"
    _check(case, "y", y, ref, dtype)
    dy = torch.randn_like(a0)
    for n_, x_, e_ in zip(
        ["da", "db"], grads(y, [a, b], dy.to(dtype)), grads(ref, [a64, b64], dy.double()), strict=True
    ):
        _check(case, n_, x_, e_, dtype)


@gpu
def test_glu_gate_multiplier_bf16_bits_as_falcon_h1():
    """``up * silu(gate * m)`` as FalconH1MLP computes it in bf16 (the scaled gate rounded first): forward, d up."""
    gen = cuda_g(15)
    gate = (torch.randn(1025, 14336, device="cuda", generator=gen) * 3).bfloat16()
    up = (torch.randn(1025, 14336, device="cuda", generator=gen) * 4).bfloat16()
    dy = torch.randn(1025, 14336, device="cuda", generator=gen).bfloat16()
    outs, d_ups = [], []
    for fn in (lambda a, b: b * F.silu(a * 0.7), lambda a, b: K.swiglu(a, b, gate_multiplier=0.7)):
        u = up.clone().requires_grad_()
        out = fn(gate, u)
        outs.append(out)
        d_ups.append(torch.autograd.grad(out, u, dy)[0])
    bits_check("swiglu gate multiplier forward", outs[1], outs[0])
    bits_check("swiglu gate multiplier d up", d_ups[1], d_ups[0])


@gpu
def test_falcon_h1_mlp_bf16_as_unpatched():
    """The whole bf16 FalconH1MLP (multipliers not 1, biases) against the swiglu drop-in's forward."""
    config = FalconH1Config(
        hidden_size=2048, intermediate_size=8192, mlp_multipliers=[0.7, 1.3], mlp_bias=True
    )
    torch.manual_seed(0)
    mlp = modeling_falcon_h1.FalconH1MLP(config).to("cuda", torch.bfloat16)
    x = torch.randn(2048, 2048, device="cuda", generator=cuda_g(7))
    x = x.bfloat16()
    with torch.no_grad():
        ref, ours = mlp(x), swiglu_forward(GluSpec(targets=["FalconH1MLP"]))(mlp, x)
    bits_check("FalconH1MLP output", ours, ref, max_ulps=8, max_differing=0.05)


@pytest.mark.exclusive
@gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_glu_backward_peak_in_place(in_place):
    """An MLP's GLU backward, bf16 [8192, 8192] gate and up: the in-place backward allocates no gradient buffers
    (out of place: two of the inputs' size), with the same gradients."""
    gen = cuda_g(0)
    x = torch.randn(8192, 256, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    w = torch.randn(256, 2 * 8192, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.05
    gate, up = (x @ w).split(8192, dim=1)
    gate, up = gate.contiguous(), up.contiguous()
    y = K.swiglu(gate, up, in_place_backward=in_place)
    dy = torch.randn(y.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref_gate, ref_up = gate.detach().clone().requires_grad_(), up.detach().clone().requires_grad_()
    want = torch.autograd.grad(glu_math.swiglu_torch(ref_gate, ref_up), [ref_gate, ref_up], dy)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    got = torch.autograd.grad(y, [gate, up], dy)
    torch.cuda.synchronize()
    extra_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    print(f"\n[gpu-peak] swiglu backward in_place={in_place}: {extra_mib:.1f} MiB above its inputs")
    assert extra_mib < (1.0 if in_place else 300.0) and (in_place or extra_mib > 250.0)
    for a, e in zip(got, want, strict=True):
        assert (a.float() - e.float()).norm() / e.float().norm() < 2e-2


@gpu
@pytest.mark.parametrize("sparsity", [0.95, 0.0])
def test_gemma3n_mlp_with_gate_sparsity_bf16_as_unpatched(sparsity):
    """Gemma3nTextMLP (a gaussian top-k on the gate where activation_sparsity > 0, then gelu_tanh(gate) * up)
    against the geglu drop-in with gate_sparsity, bf16 on the Triton kernel: forward bits and gradients."""
    from transformers.models.gemma3n import modeling_gemma3n
    from transformers.models.gemma3n.configuration_gemma3n import Gemma3nTextConfig

    from liger_registry.modules.glu import geglu_forward

    config = Gemma3nTextConfig(
        hidden_size=2048,
        intermediate_size=[8192],
        num_hidden_layers=1,
        activation_sparsity_pattern=[sparsity],
        hidden_activation="gelu_pytorch_tanh",
    )
    torch.manual_seed(0)
    mlp = modeling_gemma3n.Gemma3nTextMLP(config, layer_idx=0).to("cuda", torch.bfloat16)
    x = torch.randn(4096, 2048, device="cuda", generator=cuda_g(7)).bfloat16()
    forward = geglu_forward(GluSpec(targets=["Gemma3nTextMLP"], gate_sparsity="activation_sparsity"))
    outs = []
    for fn in (lambda t: forward(mlp, t), mlp):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        (dx,) = torch.autograd.grad(y, xi, torch.ones_like(y))
        outs.append((y, dx))
    bits_check(f"Gemma3nTextMLP sparsity {sparsity} output", outs[0][0], outs[1][0])
    _check(f"Gemma3nTextMLP sparsity {sparsity}", "dx", outs[0][1], outs[1][1], torch.bfloat16)


@gpu
def test_deepseek_v4_shared_expert_bf16_as_unpatched():
    """DeepseekV4MLP (gate and up clamped at swiglu_limit, then silu(gate) * up) against the swiglu drop-in with
    its limit, bf16, pre-activations wide enough that a fifth of them are clamped."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    config = DeepseekV4Config(hidden_size=2048, intermediate_size=4096, swiglu_limit=10.0)
    torch.manual_seed(0)
    mlp = modeling_deepseek_v4.DeepseekV4MLP(config).to("cuda", torch.bfloat16)
    x = torch.randn(2048, 2048, device="cuda", generator=cuda_g(7)) * 15
    x = x.bfloat16()
    with torch.no_grad():
        assert (mlp.up_proj(x).abs() > 10).float().mean() > 0.05
        ref = mlp(x)
        out = swiglu_forward(GluSpec(targets=["DeepseekV4MLP"], limit="limit"))(mlp, x)
    bits_check("DeepseekV4MLP output", out, ref, max_ulps=8, max_differing=0.05)
