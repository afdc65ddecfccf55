"""Names against the installed transformers: the MoE contract, renamed classes under strict=False."""

import pytest

import liger_registry
from liger_registry.registry.targets import moe_problems
from liger_registry.testing import tiny_model

MIXTRAL = """\
family: mini_moe
model_types: [mini_mixtral]
module: transformers.models.mixtral.modeling_mixtral
causal_lm: MixtralForCausalLM
forward: causal_lm_moe
"""


def test_bundled_moe_families_meet_their_contract():
    registry = liger_registry.load_registry()
    moe = [f.entry for f in registry.families.values() if f.entry.forward == "causal_lm_moe"]
    assert len(moe) >= 5 and all(moe_problems(entry) == [] for entry in moe)


@pytest.mark.parametrize(
    "head, message",
    [
        ("head: {moe: {top_k_attr: experts_per_token}}", "none of experts_per_token (the top_k"),
        ("head: {moe: {aux_loss_function: balance_loss}}", "has no function 'balance_loss'"),
        ("head: {moe: {num_experts_attrs: [n_experts]}}", "none of n_experts (the num_experts"),
    ],
)
def test_moe_contract_catches_a_wrong_name(tmp_path, head, message, capsys):
    (tmp_path / "m.yaml").write_text(MIXTRAL + head + "\n")
    entry = liger_registry.load_registry(tmp_path).family("mini_moe").entry
    assert any(message in p for p in moe_problems(entry))
    from liger_registry import cli

    assert cli.main(["lint", "--registry", str(tmp_path)]) == 1
    assert "[moe]" in capsys.readouterr().out


DBRX = """\
family: mini_dbrx
model_types: [mini_dbrx]
module: transformers.models.dbrx.modeling_dbrx
causal_lm: DbrxForCausalLM
forward: causal_lm_moe
"""


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("ffn_config.moe_top_k", None),  # DBRX's nested config: read through the dotted path
        ("ffn_config.moe_k", "none of ffn_config.moe_k (the top_k"),  # no such attribute in the nested config
        ("moe_top_k", "none of moe_top_k (the top_k"),  # the nested name alone is not top-level
    ],
)
def test_moe_contract_reads_dotted_paths_into_nested_configs(tmp_path, path, problem):
    (tmp_path / "d.yaml").write_text(
        DBRX
        + "head:\n  base_model: transformer\n"
        + f"  moe: {{num_experts_attrs: [ffn_config.moe_num_experts], top_k_attr: {path}, "
        "coefficient_attr: ffn_config.moe_loss_weight}\n"
    )
    entry = liger_registry.load_registry(tmp_path).family("mini_dbrx").entry
    problems = moe_problems(entry)
    assert problems == [] if problem is None else any(problem in p for p in problems), problems


@pytest.mark.parametrize("path", ["ffn_config..moe_top_k", "ffn_config.", "1st.moe", "ffn_config.moe top_k"])
def test_moe_names_must_be_attribute_paths(tmp_path, path):
    (tmp_path / "d.yaml").write_text(MIXTRAL + f"head: {{moe: {{top_k_attr: '{path}'}}}}\n")
    with pytest.raises(liger_registry.RegistryError, match="not an attribute name or a dotted path"):
        liger_registry.load_registry(tmp_path)


def test_apply_checks_the_moe_contract_on_the_model(tmp_path):
    (tmp_path / "m.yaml").write_text(MIXTRAL + "head: {moe: {coefficient_attr: aux_coef}}\n")
    registry = liger_registry.load_registry(tmp_path)
    model = tiny_model("mixtral")
    model.config.model_type = "mini_mixtral"
    with pytest.raises(liger_registry.PatchError, match="none of aux_coef"):
        liger_registry.apply(model, registry=registry)


def test_strict_false_turns_a_renamed_class_into_a_warning(tmp_path):
    (tmp_path / "r.yaml").write_text(
        "family: renamed\nmodel_types: [renamed_llama]\nmodule: transformers.models.llama.modeling_llama\n"
        "causal_lm: LlamaForCausalLM\nkernels:\n  rms_norm: {targets: [LlamaRMSNormV2]}\n  swiglu: {targets: [LlamaMLP]}\n"
    )
    registry = liger_registry.load_registry(tmp_path)
    model = tiny_model("llama")
    model.config.model_type = "renamed_llama"
    with pytest.raises(liger_registry.PatchError, match="LlamaRMSNormV2"):
        liger_registry.apply(model, registry=registry)
    with pytest.warns(UserWarning, match="rms_norm: .*LlamaRMSNormV2"):
        handle = liger_registry.apply(model, registry=registry, strict=False)
    assert "rms_norm" not in handle.report.counts() and handle.report.counts()["swiglu"] > 0
    handle.revert()
    with pytest.warns(UserWarning, match="LlamaRMSNormV2"):
        liger_registry.apply("renamed_llama", registry=registry, strict=False).revert()


def test_explain_shows_known_breakage():
    assert "known broken: transformers 5.24: the original" in str(liger_registry.explain("llama4"))


def _rotate(q, k, cos, sin, unsqueeze_dim=1):
    return q, k


def _func_module(func):
    """What kernels' `use_kernel_forward_from_hub` makes of a function (kernels 0.19): an nn.Module instance with a
    `kernel_layer_name` whose forward calls the function from a closure cell named `func`."""
    from torch import nn

    class Func(nn.Module):
        kernel_layer_name = "rotary_pos_emb"

        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)

    return Func()


def test_hub_wrapped_function_unwraps_a_kernels_function_module():
    from liger_registry.registry.targets import hub_wrapped_function

    wrapped = _func_module(_rotate)
    assert hub_wrapped_function(wrapped) is _rotate and wrapped(1, 2, 3, 4) == (1, 2)
    assert hub_wrapped_function(_rotate) is _rotate
    plain = type(wrapped)  # a class is never unwrapped
    assert hub_wrapped_function(plain) is plain


def test_hub_wrapped_function_through_transformers_decorator():
    """transformers' own `use_kernel_forward_from_hub`: from 5.25, with its `kernels` dependency, a function module
    (unwrapped to the function); without `kernels`, the function itself."""
    from transformers.integrations import hub_kernels

    from liger_registry.registry.targets import hub_wrapped_function

    wrapped = hub_kernels.use_kernel_forward_from_hub("rotary_pos_emb")(_rotate)
    assert hub_wrapped_function(wrapped) is _rotate


def test_llama_rotary_function_resolves_and_its_patch_is_taken_back():
    """Whatever the installed transformers makes of `apply_rotary_pos_emb` (a function, or a kernels function
    module from 5.25), the rope kernel patches it and revert restores that very object."""
    from transformers.models.llama import modeling_llama

    before = modeling_llama.apply_rotary_pos_emb
    model = tiny_model("llama")
    handle = liger_registry.apply(model, strict=True)
    assert handle.report.counts().get("rope", 0) > 0
    handle.revert()
    assert modeling_llama.apply_rotary_pos_emb is before
