"""The moe_experts forward on transformers' own experts modules (Qwen3-MoE: split gate; GPT-OSS: clamped
interleaved gate, transposed weights, biases) against the module's own forward under every experts
implementation the installed release offers that runs on CPU; DBRX's experts (separate 2-D gate and up weights in a
submodule, the down stored [in, out]) against theirs, and its tiny model patched against unpatched; Llama 4's MoE
block (every expert on every token, inputs scaled by dense router scores) and JetMoE's (router inside the block,
weights in two submodules, an output bias) against their own forwards, and their tiny models patched against
unpatched; the check that refuses a wrong gate; what the forward refuses with a reason."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations import moe as hf_moe
from transformers.models.dbrx import modeling_dbrx
from transformers.models.dbrx.configuration_dbrx import DbrxFFNConfig
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers.models.jetmoe import modeling_jetmoe
from transformers.models.jetmoe.configuration_jetmoe import JetMoeConfig
from transformers.models.llama4 import modeling_llama4
from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
from transformers.models.qwen3_moe import modeling_qwen3_moe
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.modules.moe import experts_forward, moe_experts_forward, moe_experts_problem
from liger_registry.registry import load_registry
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


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss", "mixtral", "dbrx", "llama4_text", "jetmoe"])
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
    targets = load_registry().family_for(model_type).entry.kernels.moe_experts.targets
    n_experts = sum(1 for m in model.modules() if type(m).__name__ in targets)
    assert n_experts and len(calls) == n_experts
    handle.revert()
    model(**tiny_batch(model))
    assert len(calls) == n_experts


def _dbrx(act: str = "silu"):
    config = DbrxFFNConfig(
        hidden_size=32, ffn_hidden_size=24, moe_num_experts=5, moe_top_k=2, ffn_act_fn={"name": act}
    )
    return _init(modeling_dbrx.DbrxExperts(config))


def _dbrx_spec() -> MoeExpertsSpec:
    return load_registry().families["dbrx"].entry.kernels.moe_experts


@pytest.mark.parametrize("shape", [(1, T), (T,)], ids=["batch-seq", "rows"])
def test_dbrx_experts_match_the_modules_own_forward(backend, shape, monkeypatch):
    """The registry's dbrx spec on DbrxExperts: the output (and its shape, [batch, -1, H] whatever the input's
    rank) and every gradient, fp32."""
    module = _dbrx()
    x, idx, w = _routing(module.num_experts, 2)
    x = x.view(*shape, 32).detach().requires_grad_()
    w.requires_grad_()
    want = module(x, idx, w)
    monkeypatch.setattr(modeling_dbrx.DbrxExperts, "forward", moe_experts_forward(_dbrx_spec()))
    got = module(x, idx, w)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = [x, w, *module.parameters()]
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    for a, b in zip(torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_check_serves_dbrx_and_says_why_not():
    spec = _dbrx_spec()
    assert moe_experts_problem(spec, None, modeling_dbrx.DbrxExperts, None) is None
    assert moe_experts_problem(spec, None, _dbrx(), None) is None
    assert "no act_fn" in moe_experts_problem(
        spec.model_copy(update={"act_fn": None}), None, modeling_dbrx.DbrxExperts, None
    )
    assert "not the activation of the swiglu gate" in moe_experts_problem(spec, None, _dbrx("gelu"), None)
    assert "not a module holding" in moe_experts_problem(
        spec.model_copy(update={"weights_of": "experts"}), None, _dbrx(), None
    )
    assert "do not split into" in moe_experts_problem(
        spec.model_copy(update={"num_experts": "hidden_size"}), None, _dbrx(), None
    )
    refused = moe_experts_problem(spec, None, modeling_dbrx.DbrxExpertGLU, None)
    assert "DbrxExpertGLU.forward takes (x, expert_w1, expert_v1, expert_w2)" in refused


def test_the_dbrx_forward_refuses_another_activation():
    module = _dbrx("gelu")
    x, idx, w = _routing(module.num_experts, 2)
    with pytest.raises(NotImplementedError, match="not the activation of the swiglu gate"):
        experts_forward(module, x, idx, w, **_dbrx_options())


def _dbrx_options() -> dict:
    spec = _dbrx_spec()
    names = ("gate", "gate_up", "up", "down", "down_layout", "weights_of", "num_experts", "act_fn", "output")
    return {n: getattr(spec, n) for n in names}


def test_split_options_are_checked_by_the_schema():
    with pytest.raises(ValueError, match="not clamped_swiglu"):
        MoeExpertsSpec(targets=["X"], gate="clamped_swiglu", act_config_attr=None, up="v1")
    with pytest.raises(ValueError, match="swiglu or geglu"):
        MoeExpertsSpec(targets=["X"], gate="limited_swiglu", act_fn="activation_fn")


def test_dbrx_tiny_model_patched_matches_unpatched(backend):
    """The tiny DBRX model with its registry entry applied: every experts module on the kernel, the loss and every
    gradient those of the unpatched model (fp32), parameter names and state dict unchanged."""
    import copy

    import liger_registry
    from liger_registry.testing import tiny_batch, tiny_model

    reference = tiny_model("dbrx")
    model = copy.deepcopy(reference)
    batch = tiny_batch(reference)
    keys = list(model.state_dict())
    want = reference(**batch).loss  # before the patch: rotary embedding is patched module-wide
    want.backward()
    with liger_registry.patched(model) as handle:
        patched = [r.target for r in handle.report.patched if r.kernel == "moe_experts"]
        assert len(patched) == sum(isinstance(m, modeling_dbrx.DbrxExperts) for m in model.modules()) > 0
        assert list(model.state_dict()) == keys
        got = model(**batch).loss
        got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    grads = dict(model.named_parameters())
    assert grads.keys() == dict(reference.named_parameters()).keys()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(
            grads[name].grad, p.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )


def _assert_same_grads(got: torch.Tensor, want: torch.Tensor, params: list[torch.Tensor]) -> None:
    """Every gradient of ``got`` and of ``want`` for the same upstream gradient, fp32 rounding apart."""
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    for a, b in zip(torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _llama4_block(top_k: int) -> torch.nn.Module:
    config = Llama4TextConfig(
        hidden_size=32,
        intermediate_size=24,
        intermediate_size_mlp=48,
        num_local_experts=5,
        num_experts_per_tok=top_k,
    )
    return _init(modeling_llama4.Llama4TextMoe(config))


def _llama4_spec() -> MoeExpertsSpec:
    return load_registry().families["llama4_text"].entry.kernels.moe_experts


@pytest.mark.parametrize("top_k", [1, 2])
def test_llama4_block_matches_its_own_forward(backend, top_k, monkeypatch):
    """The registry's llama4 spec on Llama4TextMoe (only the selected experts run, on the score-scaled inputs):
    the output, the router logits it returns and every gradient (router and shared expert included), fp32."""
    block = _llama4_block(top_k)
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3), requires_grad=True)
    want, want_logits = block(x)
    monkeypatch.setattr(modeling_llama4.Llama4TextMoe, "forward", moe_experts_forward(_llama4_spec()))
    got, got_logits = block(x)
    torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _assert_same_grads(got, want, [x, *block.parameters()])


def test_the_check_serves_the_llama4_block_and_says_why_not():
    spec = _llama4_spec()
    assert moe_experts_problem(spec, None, modeling_llama4.Llama4TextMoe, None) is None
    assert moe_experts_problem(spec, None, _llama4_block(1), None) is None
    no_shared = _llama4_block(1)
    del no_shared.shared_expert
    assert "no shared_expert module" in moe_experts_problem(spec, None, no_shared, None)
    experts_only = _llama4_block(1).experts  # takes the block's argument, but holds no router
    assert "no router or shared_expert module" in moe_experts_problem(spec, None, experts_only, None)
    as_experts = moe_experts_problem(spec, None, modeling_qwen3_moe.Qwen3MoeExperts, None)
    assert "takes (hidden_states, top_k_index, top_k_weights), not the hidden states alone" in as_experts
    with pytest.raises(ValueError, match="name it in weights_of"):
        MoeExpertsSpec(targets=["X"], routing="input_scaled", act_fn="act_fn")


@pytest.mark.parametrize(("model_type", "block"), [("llama4_text", "Llama4TextMoe"), ("jetmoe", "JetMoeMoE")])
def test_block_tiny_models_patched_match_unpatched(backend, model_type, block):
    """The tiny Llama 4 text and JetMoE models with their registry entries: their MoE blocks on the kernel, the
    loss and every gradient those of the unpatched model (fp32)."""
    import copy

    import liger_registry
    from liger_registry.testing import tiny_batch, tiny_model

    reference = tiny_model(model_type)
    model = copy.deepcopy(reference)
    batch = tiny_batch(reference)
    want = reference(**batch).loss
    want.backward()
    with liger_registry.patched(model) as handle:
        patched = [r.target for r in handle.report.patched if r.kernel == "moe_experts"]
        assert len(patched) == sum(type(m).__name__ == block for m in model.modules()) > 0
        got = model(**batch).loss
        got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def _jetmoe_block(top_k: int) -> torch.nn.Module:
    config = JetMoeConfig(
        hidden_size=32, intermediate_size=24, num_local_experts=5, num_experts_per_tok=top_k
    )
    return _init(modeling_jetmoe.JetMoeMoE(config))


def _jetmoe_spec() -> MoeExpertsSpec:
    return load_registry().families["jetmoe"].entry.kernels.moe_experts


@pytest.mark.parametrize("top_k", [1, 2])
def test_jetmoe_block_matches_its_own_forward(backend, top_k, monkeypatch):
    """The registry's jetmoe spec on JetMoeMoE: the output and every gradient (router, both expert weights, the
    bias, the input), fp32; the router runs once per call, as unpatched (its outputs are what transformers
    records)."""
    block = _jetmoe_block(top_k)
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3), requires_grad=True)
    want = block(x)
    calls = []
    block.router.register_forward_hook(lambda *_: calls.append(1))
    monkeypatch.setattr(modeling_jetmoe.JetMoeMoE, "forward", moe_experts_forward(_jetmoe_spec()))
    got = block(x)
    assert calls == [1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    _assert_same_grads(got, want, [x, *block.parameters()])


def test_the_check_serves_the_jetmoe_block_and_says_why_not():
    spec = _jetmoe_spec()
    assert moe_experts_problem(spec, None, modeling_jetmoe.JetMoeMoE, None) is None
    assert moe_experts_problem(spec, None, _jetmoe_block(2), None) is None
    no_router = _jetmoe_block(2)
    del no_router.router
    assert "no router module" in moe_experts_problem(spec, None, no_router, None)
    assert "has no expert weight 'input_linear.weights'" in moe_experts_problem(
        spec.model_copy(update={"gate_up": "input_linear.weights"}), None, _jetmoe_block(2), None
    )
    assert "not the hidden states alone" in moe_experts_problem(
        spec, None, modeling_qwen3_moe.Qwen3MoeExperts, None
    )
    with pytest.raises(ValueError, match="runs a swiglu or geglu gate"):
        MoeExpertsSpec(targets=["X"], routing="softmax_top_k", gate="clamped_swiglu", act_config_attr=None)
