"""The planner: dispatch by kernel kind, the activation read through act_config_attr, names that do not resolve."""

import pytest

from liger_registry.registry.loader import load_registry
from liger_registry.registry.plan import make_plan
from liger_registry.registry.resolve import resolve
from liger_registry.testing import tiny_model

MINI = """\
family: mini
model_types: [mini_llama]
module: transformers.models.llama.modeling_llama
causal_lm: LlamaForCausalLM
kernels:
  rms_norm: {targets: [LlamaRMSNorm]}
"""


def plan_for(tmp_path, kernels_yaml: str, model=True):
    (tmp_path / "mini.yaml").write_text(MINI + kernels_yaml)
    registry = load_registry(tmp_path)
    resolved = resolve(registry, registry.family("mini"))
    return make_plan(resolved, tiny_model("llama") if model else None)


def test_every_kind_is_planned_from_the_table(tmp_path):
    plan = plan_for(tmp_path, "  rope: {}\n  swiglu: {targets: [LlamaMLP]}\n")
    assert plan.problems == []
    assert {p.kernel for p in plan.replacements} >= {"rms_norm", "rope", "swiglu"}
    # with a model, rope is patched per instance: the attention modules that call the function
    assert {p.scope for p in plan.replacements if p.kernel == "rope"} == {"instance"}


def test_bogus_act_config_attr_is_a_problem(tmp_path):
    plan = plan_for(tmp_path, "  swiglu: {targets: [LlamaMLP], act_config_attr: hidden_actvation}\n")
    assert any("act_config_attr 'hidden_actvation'" in p for p in plan.problems)
    assert not [p for p in plan.replacements if p.kernel == "swiglu"]


def test_activation_read_through_act_config_attr_must_match_the_kernel(tmp_path):
    plan = plan_for(tmp_path, "  geglu: {targets: [LlamaMLP]}\n")
    assert any("geglu: the config's hidden_act is 'silu'" in p for p in plan.problems)


@pytest.mark.parametrize("model", [True, False])
def test_a_renamed_class_is_a_problem_not_an_exception(tmp_path, model):
    plan = plan_for(tmp_path, "  swiglu: {targets: [LlamaMLPRenamed]}\n", model=model)
    assert any("swiglu:" in p and "LlamaMLPRenamed" in p for p in plan.problems)
    assert {p.kernel for p in plan.replacements} >= {"rms_norm"}


@pytest.mark.parametrize(
    "names, missing",
    [("[eps, variance_epsilon]", None), ("[variance_epsilon]", None), ("[eps, epsilon]", "eps or epsilon")],
)
def test_eps_attr_alternatives_need_one_that_the_module_has(tmp_path, names, missing):
    """A list names the attribute as transformers spelt it in different releases (Llama4TextRMSNorm: `eps`, then
    `variance_epsilon` in 5.25); LlamaRMSNorm has `variance_epsilon`."""
    entry = MINI.replace(
        "rms_norm: {targets: [LlamaRMSNorm]}", f"rms_norm: {{targets: [LlamaRMSNorm], eps_attr: {names}}}"
    )
    (tmp_path / "mini.yaml").write_text(entry)
    registry = load_registry(tmp_path)
    plan = make_plan(resolve(registry, registry.family("mini")), tiny_model("llama"))
    if missing is None:
        assert plan.problems == [] and any(p.kernel == "rms_norm" for p in plan.replacements)
    else:
        assert any(f"has no attribute {missing}" in p for p in plan.problems), plan.problems


def test_an_empty_eps_attr_list_is_a_registry_error(tmp_path):
    from liger_registry.registry.errors import RegistryError

    entry = MINI.replace(
        "rms_norm: {targets: [LlamaRMSNorm]}", "rms_norm: {targets: [LlamaRMSNorm], eps_attr: []}"
    )
    (tmp_path / "mini.yaml").write_text(entry)
    with pytest.raises(RegistryError, match="eps_attr: an empty list names no attribute"):
        load_registry(tmp_path)


GEMMA4 = """\
family: mini_gemma4
model_types: [mini_gemma4]
module: transformers.models.gemma4.modeling_gemma4
causal_lm: Gemma4ForCausalLM
kernels:
  rms_norm: {targets: [Gemma4RMSNorm], casting_mode: gemma, eps_attr: [variance_epsilon, eps]%s}
"""


@pytest.mark.parametrize("optional", [False, True])
def test_weightless_norms_need_weight_optional(tmp_path, optional):
    """Gemma4RMSNorm(with_scale=False) holds no weight attribute: accepted only when the family says such a
    module normalises without a scale, else a problem naming the module (never silently unscaled)."""
    (tmp_path / "g.yaml").write_text(GEMMA4 % (", weight_optional: true" if optional else ""))
    registry = load_registry(tmp_path)
    model = tiny_model("gemma4_text")
    plan = make_plan(resolve(registry, registry.family("mini_gemma4")), model)
    weightless = [
        n for n, m in model.named_modules() if type(m).__name__ == "Gemma4RMSNorm" and not m.with_scale
    ]
    assert weightless
    norms = {p.target for p in plan.replacements if p.kernel == "rms_norm"}
    if optional:
        assert set(weightless) <= norms and not [p for p in plan.problems if p.startswith("rms_norm")]
    else:
        assert not set(weightless) & norms
        assert any(f"{weightless[0]} (Gemma4RMSNorm) has no attribute weight" in p for p in plan.problems)
