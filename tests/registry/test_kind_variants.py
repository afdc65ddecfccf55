"""Kind options that pick a variant kernel: RoPE layouts, a fused gate_up, LayerNorm1P, relu², GPT-OSS's gate."""

from __future__ import annotations

import typing

import pydantic
import pytest
import torch
from transformers.models.glm4v import modeling_glm4v
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama4 import modeling_llama4
from transformers.models.phi3 import modeling_phi3

from liger_registry.modules import glu, rope, wiring
from liger_registry.registry.loader import load_registry
from liger_registry.registry.plan import make_plan
from liger_registry.registry.resolve import resolve
from liger_registry.schemas import KINDS, GluSpec
from liger_registry.schemas.kernels import RopeLayout
from liger_registry.testing import tiny_model

REGISTRY = load_registry()


def plan_of(family: str, model=None):
    return make_plan(resolve(REGISTRY, REGISTRY.family(family)), model)


def by_kernel(plan):
    return {p.kernel: p for p in plan.replacements}


def test_every_rope_layout_but_rotate_half_has_its_drop_in():
    variants = {v for v, _ in KINDS["rope"].variants}
    assert variants == set(typing.get_args(RopeLayout)) - {"rotate_half"}


@pytest.mark.parametrize(
    ("family", "module", "attr", "drop_in"),
    [
        ("phi3", modeling_phi3, "apply_rotary_pos_emb", rope.apply_rotary_pos_emb_partial),
        ("gpt_oss", modeling_gpt_oss, "apply_rotary_pos_emb", rope.apply_rotary_pos_emb_half_split),
        ("llama4_text", modeling_llama4, "apply_rotary_emb", rope.apply_rotary_emb),
        ("glm4v", modeling_glm4v, "apply_rotary_pos_emb", rope.apply_rotary_pos_emb_interleaved_repeated),
    ],
)
def test_rope_layout_picks_the_drop_in(family, module, attr, drop_in):
    plan = plan_of(family)
    assert plan.problems == []
    rope = by_kernel(plan)["rope"]
    assert (rope.owner, rope.attribute, rope.replacement) == (module, attr, drop_in)


def test_fused_gate_up_mlp_matches_the_original_and_runs_the_fused_op():
    model = tiny_model("phi3")
    plan = plan_of("phi3", model)
    assert plan.problems == []
    swiglu = [p for p in plan.replacements if p.kernel == "swiglu"]
    assert swiglu and all(isinstance(p.owner, modeling_phi3.Phi3MLP) for p in swiglu)
    mlp = swiglu[0].owner
    x = torch.randn(3, 5, mlp.gate_up_proj.in_features)
    torch.testing.assert_close(swiglu[0].replacement(x), mlp(x), rtol=0, atol=0)


def test_gate_up_replaces_gate_and_up():
    with pytest.raises(pydantic.ValidationError, match="replaces gate and up"):
        GluSpec(targets=["Phi3MLP"], gate_up="gate_up_proj", gate="w1")
    spec = GluSpec(targets=["Phi3MLP"], gate_up="gate_up_proj")
    assert spec.module_attributes(KINDS["swiglu"].attributes) == [("gate_up_proj",), ("down_proj",)]
    assert KINDS["swiglu"].op_for(spec) == "glu_fused"


def test_gpt_oss_experts_get_the_clamped_gate_not_a_forward():
    model = tiny_model("gpt_oss")
    plan = plan_of("gpt_oss", model)
    assert plan.problems == []
    gates = [p for p in plan.replacements if p.kernel == "swiglu_clamped"]
    assert gates and {p.attribute for p in gates} == {"_apply_gate"}
    experts = gates[0].owner
    gate_up = torch.randn(7, 2 * experts.intermediate_size) * 4  # past the clamp limit
    torch.testing.assert_close(gates[0].replacement(gate_up), experts._apply_gate(gate_up), rtol=0, atol=0)
    assert by_kernel(plan_of("gpt_oss"))["swiglu_clamped"].replacement is glu.gpt_oss_apply_gate


def test_nemotron_gets_layer_norm_1p_and_relu_squared():
    model = tiny_model("nemotron")
    plan = plan_of("nemotron", model)
    assert plan.problems == []
    kernels = by_kernel(plan)
    norm, act = kernels["layer_norm"], kernels["relu_squared"]
    with torch.no_grad():
        norm.owner.weight.normal_()
    x = torch.randn(4, norm.owner.normalized_shape[0])
    torch.testing.assert_close(norm.replacement(x), norm.owner(x), rtol=0, atol=0)
    torch.testing.assert_close(act.replacement(x), act.owner(x), rtol=0, atol=0)


def test_a_target_without_the_kinds_method_is_a_problem(tmp_path):
    (tmp_path / "mini.yaml").write_text(
        "family: mini\nmodel_types: [mini_llama]\nmodule: transformers.models.llama.modeling_llama\n"
        "causal_lm: LlamaForCausalLM\nkernels:\n  swiglu_clamped: {targets: [LlamaMLP]}\n"
    )
    registry = load_registry(tmp_path)
    plan = make_plan(resolve(registry, registry.family("mini")), None)
    assert "swiglu_clamped: LlamaMLP has no method _apply_gate" in plan.problems


def test_every_kind_and_variant_has_its_maker_and_op_and_every_maker_its_kind():
    from liger_registry import kernels

    wanted = {}
    for kind in KINDS.values():
        for variant, op in (("", kind.op), *kind.variants):
            wanted[kind.name, variant] = op
            assert callable(wiring.maker(kind.name, variant)), (kind.name, variant)
            assert op in kernels.OPS, (kind.name, variant, op)
    assert set(wiring.registered_makers()) == set(wanted)


def test_a_kind_without_a_maker_names_the_kind_variant_and_the_registered_ones(monkeypatch):
    wiring.registered_makers()
    monkeypatch.delitem(wiring._MAKERS, ("rope", "partial"))
    with pytest.raises(
        LookupError, match=r"'rope', variant 'partial': decorate it with @makes\('rope', variant="
    ) as e:
        wiring.maker("rope", "partial")
    assert "rope (complex)" in str(e.value) and "rms_norm" in str(e.value)
    with pytest.raises(LookupError, match="'rope', variant 'spiral': kind 'rope' has no variant 'spiral'"):
        wiring.maker("rope", "spiral")


def test_a_maker_for_an_unknown_kind_or_variant_is_refused_when_decorated():
    wiring.registered_makers()
    with pytest.raises(ValueError, match="no kernel kind 'spiral_norm'"):
        wiring.makes("spiral_norm")
    with pytest.raises(ValueError, match="kind 'swiglu' has no variant 'spiral'; its variants: gate_up"):
        wiring.makes("swiglu", variant="spiral")
    with pytest.raises(ValueError, match="the maker of rms_norm is already registered"):
        wiring.makes("rms_norm")(lambda spec: None)
