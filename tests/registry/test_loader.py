"""Loading YAML: every problem at once, with file, line, field and a close-match suggestion."""

import textwrap

import pytest

import liger_registry
from liger_registry.registry.errors import RegistryError, UnsupportedModelError

GOOD = """\
family: mini
model_types: [mini_llama]
module: transformers.models.llama.modeling_llama
causal_lm: LlamaForCausalLM
"""


def write(tmp_path, name, text):
    (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_bundled_registry_has_the_core_families():
    registry = liger_registry.load_registry()
    assert {"llama", "mistral", "qwen2", "qwen3", "gpt_oss"} <= set(registry.families)
    assert registry.family_for("gpt_oss").entry.forward == "causal_lm_moe"


def test_every_problem_of_a_file_is_reported_with_line_and_suggestion(tmp_path):
    write(
        tmp_path,
        "bad.yaml",
        """\
        family: bad
        model_types: [bad]
        module: transformers.models.llama.modeling_llama
        causal_lm: LlamaForCausalLM
        skip_logit: auto
        flce:
          chunk_mem_const: true
        kernels:
          rms_norm: {targets: [LlamaRMSNorm], casting_mode: fp8}
        """,
    )
    with pytest.raises(RegistryError) as info:
        liger_registry.load_registry(tmp_path)
    problems = info.value.problems
    assert len(problems) == 3
    text = "\n".join(problems)
    assert "bad.yaml:5: skip_logit: unknown key (did you mean 'skip_logits'?)" in text
    assert "bad.yaml:7: flce.chunk_mem_const" in text
    assert "bad.yaml:9: kernels.rms_norm.casting_mode" in text and "'llama', 'gemma' or 'none'" in text


def test_yaml_syntax_error_names_the_line(tmp_path):
    write(tmp_path, "broken.yaml", "family: [unclosed\nmodel_types: x\n")
    with pytest.raises(RegistryError, match=r"broken.yaml:\d+: not valid YAML"):
        liger_registry.load_registry(tmp_path)


def test_unsafe_yaml_tags_are_refused(tmp_path):
    write(tmp_path, "evil.yaml", GOOD + "reason: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(RegistryError, match="not valid YAML"):
        liger_registry.load_registry(tmp_path)


def test_model_type_collision_names_both_files(tmp_path):
    write(tmp_path, "dup.yaml", GOOD.replace("mini_llama", "llama"))
    with pytest.raises(RegistryError, match="model_type 'llama' is already served by .*llama.yaml"):
        liger_registry.load_registry(tmp_path)


def test_user_directory_and_env_path_add_families(tmp_path, monkeypatch):
    write(tmp_path, "mini.yaml", GOOD)
    assert "mini" in liger_registry.load_registry(tmp_path).families
    monkeypatch.setenv("LIGER_REGISTRY_PATH", str(tmp_path))
    assert liger_registry.load_registry().family_for("mini_llama").entry.family == "mini"


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        liger_registry.load_registry(tmp_path / "nope")


def test_unknown_model_type_lists_supported_and_closest():
    with pytest.raises(UnsupportedModelError) as info:
        liger_registry.load_registry().family_for("lama")
    message = str(info.value)
    assert "Did you mean 'llama'?" in message and "qwen3" in message
    assert isinstance(info.value, ValueError)


def test_forward_name_is_checked_even_when_the_schema_fails(tmp_path):
    write(tmp_path, "both.yaml", GOOD + "forward: causal_lm_mo\nskip_logit: auto\n")
    with pytest.raises(RegistryError) as info:
        liger_registry.load_registry(tmp_path)
    text = "\n".join(info.value.problems)
    assert (
        "skip_logit: unknown key" in text
        and "'causal_lm_mo' is not a registered forward (did you mean" in text
    )
