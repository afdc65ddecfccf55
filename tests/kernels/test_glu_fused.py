"""The fused gate_up GLU (Phi3/Glm4 MLPs and the MoE experts' default gate), GPT-OSS's clamped SwiGLU and relu²
(kernels/glu) against the families' own code on both backends (Triton through the interpreter on CPU): the
PyTorch path bit-equal, Triton to a tight tolerance, forward and gradients, and rounding where the family code
rounds (fp16, bit for bit); on CUDA, fp32 and bf16 against the families in float64 and bf16 bits."""

from __future__ import annotations

import types

import pytest
import torch
from cases import GPU_DTYPES, bits_apart, check_family, cuda_randn, glu_kernels, glu_math, gpu, ulp_distance
from cases import g as _g
from transformers.activations import ACT2FN
from transformers.integrations.moe import _default_apply_gate
from transformers.models.glm4 import modeling_glm4
from transformers.models.glm4.configuration_glm4 import Glm4Config
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.nemotron import modeling_nemotron
from transformers.models.nemotron.configuration_nemotron import NemotronConfig
from transformers.models.phi3 import modeling_phi3
from transformers.models.phi3.configuration_phi3 import Phi3Config

from liger_registry import kernels as K
from liger_registry.kernels import glu
from liger_registry.kernels.glu import glu_fused, relu_squared, swiglu_clamped
from liger_registry.modules import glu as dropin


@pytest.fixture
def backend(glu_backend):
    return glu_backend


@pytest.fixture
def wide_glu_block(backend, monkeypatch):
    """The rounding checks' 1000 columns in blocks of 256 (the default's 16 would take 63 programs a row)."""
    monkeypatch.setattr(glu_kernels, "BLOCK", 256)


H, INTER = 24, 40  # with the Triton column block lowered to 16, 40 columns are 3 blocks, the last masked
ERRORS: dict[str, float] = {}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 0.0}


def _mlp(cls, config_cls, act, dtype, **cfg):
    config = config_cls(hidden_size=H, intermediate_size=INTER, hidden_act=act, **cfg)
    torch.manual_seed(0)
    return cls(config).to(dtype)


def _grads(module, x, out):
    g = torch.randn(out.shape, generator=_g(9)).to(out.dtype)
    params = [p for p in module.parameters()]
    return torch.autograd.grad(out, [x, *params], g)


def _compare(key, backend, ref_tensors, our_tensors, dtype):
    tol = 0.0 if backend == "torch" else TOL[dtype]
    for i, (a, b) in enumerate(zip(our_tensors, ref_tensors, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape
        if backend == "triton":
            ERRORS[key] = max(
                ERRORS.get(key, 0.0), ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
            )
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, i=i: f"tensor {i}: {m}")


def _dtypes(backend):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if backend == "torch" else [])


MLPS = [
    (modeling_phi3.Phi3MLP, Phi3Config, "silu", "swiglu"),
    (modeling_phi3.Phi3MLP, Phi3Config, "gelu_pytorch_tanh", "geglu"),
    (modeling_glm4.Glm4MLP, Glm4Config, "silu", "swiglu"),
]


@pytest.mark.parametrize("cls,config_cls,act,kind", MLPS, ids=["phi3-silu", "phi3-gelu_tanh", "glm4-silu"])
def test_gate_up_mlp_matches_family(backend, cls, config_cls, act, kind):
    for dtype in _dtypes(backend):
        mlp = _mlp(cls, config_cls, act, dtype)
        x = torch.randn(1, 3, H, generator=_g(1)).to(dtype).requires_grad_()
        ref = mlp(x)
        ref_grads = _grads(mlp, x, ref)
        out = dropin.gate_up_mlp_forward(kind)(mlp, x)
        _compare(
            f"{cls.__name__}.forward {act} {str(dtype)[6:]}",
            backend,
            (ref, *ref_grads),
            (out, *_grads(mlp, x, out)),
            dtype,
        )


@pytest.mark.parametrize("act,kind", [("silu", "swiglu"), ("gelu_pytorch_tanh", "geglu")])
def test_experts_apply_gate_matches_default(backend, act, kind):
    from transformers.integrations.moe import _default_apply_gate

    experts = types.SimpleNamespace(act_fn=ACT2FN[act])
    for dtype in _dtypes(backend):
        gate_up = (torch.randn(3, 2 * INTER, generator=_g(2)) * 2).to(dtype).requires_grad_()
        ref = _default_apply_gate(experts, gate_up)
        out = dropin.experts_apply_gate(kind)(experts, gate_up)
        g = torch.randn(ref.shape, generator=_g(3)).to(dtype)
        grads = [torch.autograd.grad(t, gate_up, g)[0] for t in (ref, out)]
        _compare(
            f"moe._default_apply_gate {act} {str(dtype)[6:]}",
            backend,
            (ref, grads[0]),
            (out, grads[1]),
            dtype,
        )


@pytest.mark.parametrize("limit,alpha", [(7.0, 1.702), (0.5, 1.0)])
def test_clamped_swiglu_matches_gpt_oss(backend, limit, alpha):
    experts = types.SimpleNamespace(limit=limit, alpha=alpha)
    for dtype in _dtypes(backend):
        gate_up = (torch.randn(1, 4, 2 * INTER, generator=_g(2)) * 4).to(dtype)
        gate_up[0, 0, :4] = torch.tensor([limit, -limit, limit, limit + 1])  # clamp edges: inclusive bounds
        gate_up.requires_grad_()
        ref = modeling_gpt_oss.GptOssExperts._apply_gate(experts, gate_up)
        out = dropin.gpt_oss_apply_gate(experts, gate_up)
        g = torch.randn(ref.shape, generator=_g(3)).to(dtype)
        (dref,) = torch.autograd.grad(ref, gate_up, g)
        (dout,) = torch.autograd.grad(out, gate_up, g)
        _compare(
            f"GptOssExperts._apply_gate limit={limit} {str(dtype)[6:]}",
            backend,
            (ref, dref),
            (out, dout),
            dtype,
        )


def test_clamped_swiglu_in_gpt_oss_experts_forward(backend):
    """The whole eager experts loop with our gate: the GEMMs stay, only the activation moves."""
    config = modeling_gpt_oss.GptOssConfig(
        hidden_size=H, intermediate_size=INTER, num_local_experts=2, num_experts_per_tok=2, swiglu_limit=1.0
    )
    torch.manual_seed(0)
    experts = modeling_gpt_oss.GptOssExperts(config)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(4, H, generator=_g(4)).requires_grad_()
    idx = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0]])
    weights = torch.rand(4, 2, generator=_g(6))
    ref = experts(x, idx, weights)
    ref_grads = _grads(experts, x, ref)
    experts._apply_gate = types.MethodType(dropin.gpt_oss_apply_gate, experts)
    out = experts(x, idx, weights)
    _compare(
        "GptOssExperts.forward", backend, (ref, *ref_grads), (out, *_grads(experts, x, out)), torch.float32
    )


def test_relu_squared_matches_nemotron(backend):
    for dtype in _dtypes(backend):
        x = torch.randn(3, 7, 37, generator=_g(7)).to(dtype)
        x[0, 0, :2] = 0.0
        x.requires_grad_()
        act = ACT2FN["relu2"]
        ref = act(x)
        out = dropin.relu_squared_forward(act, x)
        g = torch.randn(ref.shape, generator=_g(8)).to(dtype)
        (dref,) = torch.autograd.grad(ref, x, g)
        (dout,) = torch.autograd.grad(out, x, g)
        _compare(f"ReLUSquaredActivation {str(dtype)[6:]}", backend, (ref, dref), (out, dout), dtype)


def test_relu_squared_in_nemotron_mlp(backend):
    mlp = _mlp(modeling_nemotron.NemotronMLP, NemotronConfig, "relu2", torch.float32)
    x = torch.randn(2, 5, H, generator=_g(1)).requires_grad_()
    ref = mlp(x)
    ref_grads = _grads(mlp, x, ref)
    mlp.act_fn.forward = types.MethodType(dropin.relu_squared_forward, mlp.act_fn)
    out = mlp(x)
    _compare("NemotronMLP.forward", backend, (ref, *ref_grads), (out, *_grads(mlp, x, out)), torch.float32)


def test_rejects_odd_gate_up_and_unknown_kind():
    with pytest.raises(ValueError, match="even"):
        glu.glu_fused(torch.randn(2, 5))
    with pytest.raises(ValueError, match="even"):
        glu.swiglu_clamped(torch.randn(2, 5), 7.0, 1.702)
    with pytest.raises(ValueError, match="kind"):
        glu.glu_fused(torch.randn(2, 4), "relu")


def test_zz_print_errors():
    """Prints the largest Triton-vs-family relative error of each case (run with -s)."""
    for key, err in sorted(ERRORS.items()):
        print(f"[glu-variant max rel err] {key}: {err:.3g}")


# ---------------------------------------------------------------- rounding as the family code rounds (fp16)
DTYPE = torch.float16
ROWS, COLS = 8, 1000  # 1000 columns: several Triton blocks of 256, the last one masked
MAX_ULPS, MAX_DIFFERING = 1, 2e-3  # Triton's fp32 activation may flip an fp16 rounding now and then
GLUS = [("swiglu", "silu", K.swiglu), ("geglu", "gelu_pytorch_tanh", K.geglu)]


def _gate(act: str):
    gate = torch.randn(ROWS, COLS, generator=_g(0)) * 3
    if "gelu" in act:
        # below -3, torch's own 0.5 * x * (1 + tanh(.)) cancels: its last bits there are those of its tanh
        # implementation (a CPU vector library here, CUDA's tanhf on the GPU), not of where it rounds
        gate = gate.clamp(min=-3.0)
    return gate.to(DTYPE)


def _up():
    return (torch.randn(ROWS, COLS, generator=_g(1)) * 4).to(DTYPE)


def _assert_rounds_close(key, backend, ours, ref):
    assert ours.dtype == ref.dtype == DTYPE and ours.shape == ref.shape
    d = ulp_distance(ours, ref)
    if backend == "torch":  # op for op what the family code runs: the same bits
        assert int(d.max()) == 0, f"{key}: {int((d > 0).sum())} elements differ"
        return
    differing = (d > 0).float().mean().item()
    assert int(d.max()) <= MAX_ULPS and differing <= MAX_DIFFERING, (
        f"{key}: max {int(d.max())} ulps, {differing:.2%} of the elements differ"
    )


@pytest.mark.parametrize("name,act,kernel", GLUS, ids=[glu[0] for glu in GLUS])
def test_fused_gate_up_rounds_as_phi3_and_the_experts(backend, wide_glu_block, name, act, kernel):
    """Phi3MLP / Glm4MLP (``up * act_fn(gate)`` after ``chunk``) and the MoE experts' default ``_apply_gate``."""
    experts = types.SimpleNamespace(act_fn=ACT2FN[act])
    gate_up = torch.cat([_gate(act), _up()], -1)
    ref = _default_apply_gate(experts, gate_up)
    _assert_rounds_close(f"glu_fused {name}", backend, glu.glu_fused(gate_up, name), ref)
    _assert_rounds_close(f"experts {name}", backend, dropin.experts_apply_gate(name)(experts, gate_up), ref)


@pytest.mark.parametrize("limit,alpha", [(7.0, 1.702), (1.0, 1.0)])
def test_clamped_swiglu_rounds_as_gpt_oss(backend, wide_glu_block, limit, alpha):
    """``GptOssExperts._apply_gate`` rounds after each op: clamp, ``gate * alpha``, sigmoid, ``gate * sig``,
    ``up + 1`` and the product."""
    experts = types.SimpleNamespace(limit=limit, alpha=alpha)
    gate_up = (torch.randn(ROWS, 2 * COLS, generator=_g(3)) * 4).to(DTYPE)
    ref = modeling_gpt_oss.GptOssExperts._apply_gate(experts, gate_up)
    _assert_rounds_close("clamped swiglu", backend, dropin.gpt_oss_apply_gate(experts, gate_up), ref)
    dy = torch.randn(ROWS, COLS, generator=_g(4)).to(DTYPE)
    grads = []
    for fn in (modeling_gpt_oss.GptOssExperts._apply_gate, dropin.gpt_oss_apply_gate):
        gu = gate_up.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(experts, gu), gu, dy)
        grads.append(g[..., 1::2])  # d up: the gate's rounded glu times dy
    _assert_rounds_close("clamped swiglu d up", backend, grads[1], grads[0])


def test_relu_squared_rounds_once_as_nemotron(backend, wide_glu_block):
    x = (torch.randn(ROWS, COLS, generator=_g(5)) * 30).to(DTYPE)
    _assert_rounds_close("relu2", backend, glu.relu_squared(x), ACT2FN["relu2"](x))


# ---------------------------------------------------------------- CUDA: against the families in float64
NG, GINTER = 4096, 8192  # rows, intermediate size


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_glu_fused(kind, dtype):
    check_family(f"glu_fused {kind}", lambda gu: glu_fused(gu, kind), lambda gu: glu_math.glu_fused_torch(gu, kind),
          [cuda_randn(NG, 2 * GINTER, scale=2.0)], dtype)  # fmt: skip


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_swiglu_clamped(dtype):
    experts = types.SimpleNamespace(limit=7.0, alpha=1.702)
    check_family("swiglu_clamped gpt_oss", lambda gu: swiglu_clamped(gu, 7.0, 1.702),
          lambda gu: modeling_gpt_oss.GptOssExperts._apply_gate(experts, gu),
          [cuda_randn(NG, 2 * GINTER, scale=4.0)], dtype)  # fmt: skip


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_relu_squared(dtype):
    check_family("relu2 nemotron", relu_squared, ACT2FN["relu2"], [cuda_randn(NG, GINTER)], dtype)


# bf16 bits against the family code: the activation's last fp32 bit may differ between Triton and CUDA now
# and then (a 1-ulp flip of a rounded intermediate); where each op rounds is the same. GPT-OSS's gate rounds
# five times, so one flipped sigmoid may move its result by a few ulps.
BITS_MAX_DIFFERING = 2e-3


def gpu_bits_check(case, ours, family, gate_up, max_ulps=1):
    out, ref = ours(gate_up), family(gate_up)
    assert out.dtype == ref.dtype == torch.bfloat16 and out.shape == ref.shape
    ulps, differing = bits_apart(out, ref)
    print(f"[gpu-bits] {case} max_ulps={ulps} differing={differing:.2e}", flush=True)
    assert ulps <= max_ulps and differing <= BITS_MAX_DIFFERING, (
        f"{case}: {ulps} ulps, {differing:.2e} differ"
    )


@gpu
@pytest.mark.usefixtures("auto_backend")
@pytest.mark.parametrize("kind,act", [("swiglu", "silu"), ("geglu", "gelu_pytorch_tanh")])
def test_glu_fused_bf16_bits_as_phi3_and_experts(kind, act):
    experts = types.SimpleNamespace(act_fn=ACT2FN[act])
    gate = cuda_randn(NG, GINTER, scale=3.0)
    if kind == "geglu":  # below -3 torch's own 1 + tanh(.) cancels: its last bits are those of CUDA's tanhf
        gate = gate.clamp(min=-3.0)
    gate_up = torch.cat([gate, cuda_randn(NG, GINTER, seed=1, scale=4.0)], -1).bfloat16()
    gpu_bits_check(f"glu_fused {kind}", lambda gu: glu_fused(gu, kind), lambda gu: _default_apply_gate(experts, gu),
               gate_up)  # fmt: skip


@gpu
@pytest.mark.usefixtures("auto_backend")
def test_swiglu_clamped_bf16_bits_as_gpt_oss():
    experts = types.SimpleNamespace(limit=7.0, alpha=1.702)
    gpu_bits_check("swiglu_clamped", lambda gu: swiglu_clamped(gu, 7.0, 1.702),
               lambda gu: modeling_gpt_oss.GptOssExperts._apply_gate(experts, gu),
               cuda_randn(NG, 2 * GINTER, scale=4.0).bfloat16(), max_ulps=4)  # fmt: skip


@gpu
@pytest.mark.usefixtures("auto_backend")
def test_relu_squared_bf16_bits_as_nemotron():
    gpu_bits_check("relu2", relu_squared, ACT2FN["relu2"], cuda_randn(NG, GINTER, scale=30.0).bfloat16())
