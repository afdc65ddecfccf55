"""The moe_experts forward on transformers' own experts modules (Qwen3-MoE: split gate; GPT-OSS: clamped
interleaved gate, transposed weights, biases) against the module's own forward under every experts
implementation the installed release offers that runs on CPU; the check that refuses a wrong gate; what the
forward refuses with a reason."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations import moe as hf_moe
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.qwen3_moe import modeling_qwen3_moe
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.modules.moe import experts_forward, moe_experts_forward, moe_experts_problem
from liger_registry.schemas import MoeExpertsSpec

T = 11


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    if request.param == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


def _qwen3():
    config = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2)
    return modeling_qwen3_moe.Qwen3MoeExperts(config), "swiglu"


def _gpt_oss():
    config = GptOssConfig(hidden_size=32, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
    return modeling_gpt_oss.GptOssExperts(config), "clamped_swiglu"


def _init(module: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return module


def _routing(n_experts: int, top_k: int):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(T, n_experts, generator=g)
    w, idx = torch.softmax(logits, -1).topk(top_k, -1)
    return torch.randn(T, 32, generator=g), idx, w


def _implementations() -> list[str]:
    names = ["eager", *(n for n in ("grouped_mm", "batched_mm") if n in hf_moe.ALL_EXPERTS_FUNCTIONS)]
    return names


@pytest.mark.parametrize("make", [_qwen3, _gpt_oss], ids=["qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("implementation", _implementations())
def test_matches_the_modules_own_forward(backend, make, implementation):
    module, gate = make()
    module = _init(module)
    module.config._experts_implementation = implementation
    x, idx, w = _routing(module.num_experts, 2)
    x.requires_grad_()
    w.requires_grad_()
    want = module(x, idx, w)
    got = experts_forward(module, x, idx, w, gate)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    params = [x, w, *module.parameters()]
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    for a, b in zip(torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_maker_binds_as_the_class_forward_and_keeps_the_state_dict(monkeypatch):
    module, gate = _gpt_oss()
    module = _init(module)
    x, idx, w = _routing(module.num_experts, 2)
    keys = list(module.state_dict())
    want = module(x, idx, w)
    spec = MoeExpertsSpec(targets=["GptOssExperts"], gate=gate, act_config_attr=None)
    monkeypatch.setattr(modeling_gpt_oss.GptOssExperts, "forward", moe_experts_forward(spec))
    torch.testing.assert_close(module(x, idx, w), want, rtol=1e-5, atol=1e-5)
    assert list(module.state_dict()) == keys


def test_the_check_refuses_a_gate_the_class_does_not_compute():
    clamped = MoeExpertsSpec(targets=["Qwen3MoeExperts"], gate="clamped_swiglu", act_config_attr=None)
    plain = MoeExpertsSpec(targets=["GptOssExperts"])
    assert "default gate" in moe_experts_problem(clamped, None, modeling_qwen3_moe.Qwen3MoeExperts, None)
    assert "overrides _apply_gate" in moe_experts_problem(plain, None, modeling_gpt_oss.GptOssExperts, None)
    assert moe_experts_problem(plain, None, modeling_qwen3_moe.Qwen3MoeExperts, None) is None
    refused = moe_experts_problem(plain, None, modeling_qwen3_moe.Qwen3MoeMLP, None)
    assert "not a transformers experts module" in refused


def test_expert_parallel_and_quantised_experts_are_refused_with_the_reason():
    module, gate = _qwen3()
    x, idx, w = _routing(module.num_experts, 2)
    module._is_expert_parallel = True
    with pytest.raises(NotImplementedError, match="expert parallelism"):
        experts_forward(module, x, idx, w, gate)
    module._is_expert_parallel = False
    del module.gate_up_proj
    module.gate_up_proj = torch.nn.Parameter(torch.zeros(6, 48, 32, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(TypeError, match="quantised experts"):
        experts_forward(module, x, idx, w, gate)


def test_the_clamped_spec_takes_no_config_activation():
    with pytest.raises(ValueError, match="act_config_attr: null"):
        MoeExpertsSpec(targets=["GptOssExperts"], gate="clamped_swiglu")


def test_routing_arguments_by_keyword_under_either_name(monkeypatch):
    module, gate = _gpt_oss()
    module = _init(module)
    x, idx, w = _routing(module.num_experts, 2)
    want = module(x, router_indices=idx, routing_weights=w)
    spec = MoeExpertsSpec(targets=["GptOssExperts"], gate=gate, act_config_attr=None)
    monkeypatch.setattr(modeling_gpt_oss.GptOssExperts, "forward", moe_experts_forward(spec))
    torch.testing.assert_close(module(x, router_indices=idx, routing_weights=w), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module(x, top_k_index=idx, top_k_weights=w), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="routing indices and weights are required"):
        module(x)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss", "mixtral"])
def test_a_patched_model_runs_its_experts_on_the_kernel(model_type, monkeypatch):
    """apply() on a tiny model: every experts module's forward goes through moe_experts (counted), and revert
    gives transformers' forward back."""
    import liger_registry
    from liger_registry.modules import moe
    from liger_registry.testing import tiny_batch, tiny_model

    calls = []
    real = moe.moe_experts
    monkeypatch.setattr(moe, "moe_experts", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = tiny_model(model_type)
    handle = liger_registry.apply(model, moe_experts=True)  # explicit: on even where a family ships it off
    model(**tiny_batch(model))
    n_experts = sum(1 for m in model.modules() if type(m).__name__.endswith("Experts"))
    assert n_experts and len(calls) == n_experts
    handle.revert()
    model(**tiny_batch(model))
    assert len(calls) == n_experts
