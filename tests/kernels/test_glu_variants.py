"""Fused gate_up SwiGLU/GeGLU, GPT-OSS's clamped SwiGLU and relu² vs the families' own code: torch path
bit-equal, Triton (interpreter) to tight tolerance, forward and gradients."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.glm4 import modeling_glm4
from transformers.models.glm4.configuration_glm4 import Glm4Config
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.nemotron import modeling_nemotron
from transformers.models.nemotron.configuration_nemotron import NemotronConfig
from transformers.models.phi3 import modeling_phi3
from transformers.models.phi3.configuration_phi3 import Phi3Config

from liger_registry.kernels import glu, triton_utils
from liger_registry.modules import glu as dropin

H, INTER = 24, 40  # with the Triton column block lowered to 16, 40 columns are 3 blocks, the last masked
ERRORS: dict[str, float] = {}
needs_interpreter = pytest.mark.skipif(
    not triton_utils.INTERPRET_AT_IMPORT,
    reason="CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import",
)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 0.0}


@pytest.fixture
def backend(glu_backend):
    return glu_backend


def _g(seed):
    return torch.Generator().manual_seed(seed)


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
