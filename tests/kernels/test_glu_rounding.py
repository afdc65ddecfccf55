"""Each GLU kernel rounds where the transformers code it replaces rounds, so a half-precision MLP gives the
unpatched model's bits: ``act_fn(gate) * up`` (LlamaMLP, GemmaMLP, Phi3MLP, the MoE experts' default gate)
rounds the activation to the input dtype before the multiply; GPT-OSS's clamped gate rounds after every op;
relu² (nemotron) rounds once. Forward and the ``up`` gradient, in fp16 on both backends (Triton through the
interpreter); the same checks in bf16 on the GPU are in test_gpu.py / test_gpu_variants.py."""

from __future__ import annotations

import types

import pytest
import torch
from kernel_refs import ulp_distance
from transformers.activations import ACT2FN
from transformers.integrations.moe import _default_apply_gate
from transformers.models.gpt_oss import modeling_gpt_oss

from liger_registry import kernels as K
from liger_registry.kernels import glu
from liger_registry.modules import glu as dropin

DTYPE = torch.float16
ROWS, COLS = 8, 1000  # 1000 columns: several Triton blocks, the last one masked
# the Triton path may differ from torch's own fp32 activation in its last fp32 bit, which flips an fp16
# rounding now and then (1 ulp): the rounding placement itself leaves the bits equal. Rounding once instead
# (the old kernels) differs on about a quarter of the elements.
MAX_ULPS = 1
MAX_DIFFERING = 2e-3


GLU_BLOCK = 256  # the Triton block of the glu_backend fixture (tests/conftest.py)


@pytest.fixture
def backend(glu_backend):
    return glu_backend


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _gate(act: str):
    gate = torch.randn(ROWS, COLS, generator=_g(0)) * 3
    if "gelu" in act:
        # below -3, torch's own 0.5 * x * (1 + tanh(.)) cancels: its last bits there are those of its tanh
        # implementation (a CPU vector library here, CUDA's tanhf on the GPU), not of where it rounds
        gate = gate.clamp(min=-3.0)
    return gate.to(DTYPE)


def _up():
    return (torch.randn(ROWS, COLS, generator=_g(1)) * 4).to(DTYPE)


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


@pytest.mark.parametrize("name,act,kernel", GLUS, ids=[g[0] for g in GLUS])
def test_glu_rounds_as_the_mlp_it_replaces(backend, name, act, kernel):
    """LlamaMLP (silu) / GemmaMLP (gelu_pytorch_tanh): ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""
    act_fn = ACT2FN[act]
    gate, up = _gate(act), _up()

    def family(g, u):
        return act_fn(g) * u

    _assert_bits_close(f"{name} forward", backend, kernel(gate, up), family(gate, up))
    ref_du, our_du = _up_grad(family, kernel, gate, up)
    _assert_bits_close(f"{name} d up", backend, our_du, ref_du)


@pytest.mark.parametrize("name,act,kernel", GLUS, ids=[g[0] for g in GLUS])
def test_fused_gate_up_rounds_as_phi3_and_the_experts(backend, name, act, kernel):
    """Phi3MLP / Glm4MLP (``up * act_fn(gate)`` after ``chunk``) and the MoE experts' default ``_apply_gate``."""
    experts = types.SimpleNamespace(act_fn=ACT2FN[act])
    gate_up = torch.cat([_gate(act), _up()], -1)
    ref = _default_apply_gate(experts, gate_up)
    _assert_bits_close(f"glu_fused {name}", backend, glu.glu_fused(gate_up, name), ref)
    _assert_bits_close(f"experts {name}", backend, dropin.experts_apply_gate(name)(experts, gate_up), ref)


@pytest.mark.parametrize("limit,alpha", [(7.0, 1.702), (1.0, 1.0)])
def test_clamped_swiglu_rounds_as_gpt_oss(backend, limit, alpha):
    """``GptOssExperts._apply_gate`` rounds after each op: clamp, ``gate * alpha``, sigmoid, ``gate * sig``,
    ``up + 1`` and the product."""
    experts = types.SimpleNamespace(limit=limit, alpha=alpha)
    gate_up = (torch.randn(ROWS, 2 * COLS, generator=_g(3)) * 4).to(DTYPE)
    ref = modeling_gpt_oss.GptOssExperts._apply_gate(experts, gate_up)
    _assert_bits_close("clamped swiglu", backend, dropin.gpt_oss_apply_gate(experts, gate_up), ref)
    dy = torch.randn(ROWS, COLS, generator=_g(4)).to(DTYPE)
    grads = []
    for fn in (modeling_gpt_oss.GptOssExperts._apply_gate, dropin.gpt_oss_apply_gate):
        gu = gate_up.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(experts, gu), gu, dy)
        grads.append(g[..., 1::2])  # d up: the gate's rounded glu times dy
    _assert_bits_close("clamped swiglu d up", backend, grads[1], grads[0])


def test_relu_squared_rounds_once_as_nemotron(backend):
    x = (torch.randn(ROWS, COLS, generator=_g(5)) * 30).to(DTYPE)
    _assert_bits_close("relu2", backend, glu.relu_squared(x), ACT2FN["relu2"](x))


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
