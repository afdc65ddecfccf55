"""The gated-MLP drop-in with a clamp limit (``GluSpec.limit``) against DeepSeek-V4's shared expert
(``DeepseekV4MLP``: gate clamped above, up to +-limit, then ``silu(gate) * up``), on both backends (Triton through
the interpreter): forward and every gradient, the torch path bit-equal, Triton to a tight tolerance. The same for
the gate sparsity option (``GluSpec.gate_sparsity``) against Gemma 3n's MLP. And the per-module activation check of
the GLU kinds."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from transformers.models.deepseek_v4 import modeling_deepseek_v4
from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

import liger_registry
from liger_registry.modules.glu import activation_problem, geglu_forward, geglu_problem, swiglu_forward
from liger_registry.registry import load_registry
from liger_registry.schemas import GluSpec
from liger_registry.testing import tiny_model

H, INTER = 24, 40
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.fixture
def backend(glu_backend):
    return glu_backend


def _v4_mlp(limit, dtype):
    config = DeepseekV4Config(hidden_size=H, intermediate_size=INTER, swiglu_limit=limit)
    torch.manual_seed(0)
    mlp = modeling_deepseek_v4.DeepseekV4MLP(config).to(dtype)
    with torch.no_grad():
        for p in mlp.parameters():
            p.mul_(4)  # pre-activations of std ~2: a limit of 1.5 clamps a good share of gate and up
    return mlp


def _with_grads(out, ref, params):
    """(out, its gradients), (ref, its gradients) w.r.t. params, for one random incoming gradient."""
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2)).to(ref.dtype)
    return tuple((y, *torch.autograd.grad(y, params, g)) for y in (out, ref))


def _dtypes(backend):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if backend == "torch" else [])


@pytest.mark.parametrize("limit", [1.5, 10.0], ids=["clamping", "wide"])
def test_swiglu_forward_with_limit_matches_deepseek_v4_mlp(backend, limit):
    forward = swiglu_forward(GluSpec(targets=["DeepseekV4MLP"], limit="limit"))
    for dtype in _dtypes(backend):
        mlp = _v4_mlp(limit, dtype)
        x = torch.randn(2, 3, H, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
        ref, out = mlp(x), forward(mlp, x)
        if limit == 1.5:  # the case tests the clamps: some of each projection must be past the limit
            assert (mlp.gate_proj(x) > limit).any() and (mlp.up_proj(x).abs() > limit).any()
        out_all, ref_all = _with_grads(out, ref, [x, *mlp.parameters()])
        for i, (a, b) in enumerate(zip(out_all, ref_all, strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, i
            if backend == "torch":
                assert torch.equal(a, b), f"{dtype} tensor {i}"
            else:
                rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                assert rel <= TOL[dtype], f"{dtype} tensor {i}: rel err {rel:.3g}"


def test_without_limit_the_clamped_mlp_differs():
    """The option is what makes the drop-in exact: the plain forward on a clamping MLP is not."""
    mlp = _v4_mlp(1.5, torch.float32)
    x = torch.randn(2, 3, H, generator=torch.Generator().manual_seed(1))
    plain = swiglu_forward(GluSpec(targets=["DeepseekV4MLP"]))
    assert not torch.allclose(plain(mlp, x), mlp(x), rtol=1e-3, atol=1e-3)


def test_limit_is_for_split_projections_only():
    with pytest.raises(ValidationError, match="limit 'limit' acts on split gate and up projections"):
        GluSpec(targets=["M"], gate_up="gate_up_proj", limit="limit")


def test_deepseek_v4_installs_swiglu_with_its_limit():
    entry = load_registry().family("deepseek_v4").entry
    swiglu = entry.kernels.swiglu
    assert swiglu.enabled and swiglu.targets == ["DeepseekV4MLP"] and swiglu.limit == "limit"


class _MLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act_fn = act


@pytest.mark.parametrize(
    ("kind", "act", "ok"),
    [
        ("swiglu", torch.nn.SiLU(), True),
        ("geglu", torch.nn.GELU(approximate="tanh"), True),
        ("geglu", torch.nn.GELU(), False),
        ("swiglu", torch.nn.GELU(approximate="tanh"), False),
    ],
    ids=["silu", "gelu-tanh", "exact-gelu-for-geglu", "gelu-for-swiglu"],
)
def test_activation_problem_reads_the_module_activation(kind, act, ok):
    problem = activation_problem(kind, _MLP(act))
    assert (problem is None) is ok, problem
    if not ok:
        assert f"_MLP.act_fn is {type(act).__name__}, not the {kind} kernel's activation" == problem


def test_activation_problem_passes_a_class_and_an_mlp_without_activation_module():
    assert activation_problem("swiglu", _MLP) is None
    assert activation_problem("swiglu", torch.nn.Linear(2, 2)) is None


def test_a_vision_tower_with_another_activation_is_refused_not_patched_with_silu():
    """glm4v_moe's swiglu section covers the vision MLP, whose activation is vision_config.hidden_act: the text
    config's check alone passed a GELU tower and the kernel computed silu."""
    model = tiny_model("glm4v_moe", vision_config={"hidden_act": "gelu"})
    with pytest.raises(
        liger_registry.PatchError, match="Mlp.act_fn is GELUActivation, not the swiglu kernel.s activation"
    ):
        liger_registry.apply(model)


def _gemma3n_mlp(sparsity, dtype):
    from transformers.models.gemma3n import modeling_gemma3n
    from transformers.models.gemma3n.configuration_gemma3n import Gemma3nTextConfig

    config = Gemma3nTextConfig(
        hidden_size=H,
        intermediate_size=[INTER],
        num_hidden_layers=1,
        activation_sparsity_pattern=[sparsity],
        hidden_activation="gelu_pytorch_tanh",
    )
    torch.manual_seed(0)
    return modeling_gemma3n.Gemma3nTextMLP(config, layer_idx=0).to(dtype)


GEMMA3N_GEGLU = GluSpec(targets=["Gemma3nTextMLP"], gate_sparsity="activation_sparsity")


@pytest.mark.parametrize("sparsity", [0.95, 0.0], ids=["sparse", "dense"])
def test_geglu_forward_with_gate_sparsity_matches_gemma3n_mlp(backend, sparsity):
    """Gemma3nTextMLP with activation sparsity: transformers' gaussian top-k on the gate, then the kernel."""
    forward = geglu_forward(GEMMA3N_GEGLU)
    for dtype in _dtypes(backend):
        mlp = _gemma3n_mlp(sparsity, dtype)
        x = torch.randn(2, 3, H, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
        ref, out = mlp(x), forward(mlp, x)
        if sparsity:  # most of the gate is cut to zero by the top-k: the case tests it
            assert (mlp._gaussian_topk(mlp.gate_proj(x)) == 0).float().mean() > 0.5
        out_all, ref_all = _with_grads(out, ref, [x, *mlp.parameters()])
        for i, (a, b) in enumerate(zip(out_all, ref_all, strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, i
            rel = ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
            assert rel <= (0.0 if backend == "torch" and i == 0 else TOL.get(dtype, 1e-2)), (
                f"{dtype} tensor {i}"
            )


def test_without_gate_sparsity_the_sparse_mlp_differs():
    """The option is what makes the drop-in exact on a sparse layer: the plain forward is not."""
    mlp = _gemma3n_mlp(0.95, torch.float32)
    x = torch.randn(2, 3, H, generator=torch.Generator().manual_seed(1))
    plain = geglu_forward(GluSpec(targets=["Gemma3nTextMLP"]))
    assert not torch.allclose(plain(mlp, x), mlp(x), rtol=1e-3, atol=1e-3)
    assert torch.allclose(geglu_forward(GEMMA3N_GEGLU)(mlp, x), mlp(x), rtol=1e-5, atol=1e-6)


def test_gate_sparsity_needs_the_mlps_top_k_and_split_projections():
    assert geglu_problem(GEMMA3N_GEGLU, None, _gemma3n_mlp(0.95, torch.float32), None) is None
    problem = geglu_problem(GEMMA3N_GEGLU, None, modeling_deepseek_v4.DeepseekV4MLP, None)
    assert problem == "DeepseekV4MLP has no _gaussian_topk method for gate_sparsity 'activation_sparsity'"
    with pytest.raises(
        ValidationError, match="gate_sparsity 'activation_sparsity' acts on split gate and up"
    ):
        GluSpec(targets=["M"], gate_up="gate_up_proj", gate_sparsity="activation_sparsity")


def test_gemma3n_text_installs_geglu_on_its_sparse_layer_too():
    """The tiny Gemma 3n's first layer is sparse (0.95), as the released checkpoints' first 10: patched, its MLPs
    run the kernel and the model's loss and logits match the unpatched model's."""
    model = tiny_model("gemma3n_text")
    assert [layer.mlp.activation_sparsity for layer in model.model.layers][:2] == [0.95, 0.0]
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    ref = model(input_ids=ids).logits
    with liger_registry.patched(model) as handle:
        assert any(str(r.kernel) == "geglu" for r in handle.report.patched)
        out = model(input_ids=ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
