"""Loading YAML: every problem at once, with file, line, field and a close-match suggestion."""

import textwrap

import pytest

import liger_registry
from liger_registry.registry.errors import RegistryError, RegistryWarning, UnsupportedModelError

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
    with pytest.raises(RegistryError, match=r"broken.yaml:\d+: family: not valid YAML"):
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


def test_registry_path_naming_a_file_says_it_is_not_a_directory(tmp_path, monkeypatch):
    write(tmp_path, "mini.yaml", GOOD)
    monkeypatch.setenv("LIGER_REGISTRY_PATH", str(tmp_path / "mini.yaml"))
    with pytest.raises(
        RegistryError,
        match=r"mini.yaml: is not a directory; a registry path names directories \(named in the environment",
    ):
        liger_registry.load_registry()


def test_a_duplicate_on_the_registry_path_is_a_warning_naming_both_files(tmp_path, monkeypatch):
    bundled = liger_registry.load_registry().family_for("llama").path
    write(tmp_path, "llama.yaml", bundled.read_text())
    write(tmp_path, "mini.yaml", GOOD)
    monkeypatch.setenv("LIGER_REGISTRY_PATH", str(tmp_path))
    with pytest.warns(RegistryWarning) as caught:
        registry = liger_registry.load_registry()
    (message,) = [str(w.message) for w in caught]
    assert f"{tmp_path / 'llama.yaml'}: family 'llama' is already defined in {bundled}" in message
    assert "skipped" in message
    assert registry.family_for("llama").path == bundled  # every apply still works
    assert registry.family_for("mini_llama").entry.family == "mini"  # and the rest of the directory loads
    assert registry.skipped == [f"{tmp_path / 'llama.yaml'}: family 'llama' is already defined in {bundled}"]


def _problems(tmp_path, text: str) -> list[str]:
    write(tmp_path, "bad.yaml", text)
    with pytest.raises(RegistryError) as info:
        liger_registry.load_registry(tmp_path)
    return info.value.problems


FIELD_TYPO = """\
family: bad
model_types: [bad]
module: transformers.models.llama.modeling_llama
causal_lm: LlamaForCausalLM
flce:
  chunk_mem_const: 1
kernels:
  rms_norm: {targets: [LlamaRMSNorm]}
  swiglu: {targets: [LlamaMLP]}
skip_logit: auto
"""


def test_a_duplicate_key_and_field_errors_are_reported_together(tmp_path):
    text = FIELD_TYPO.replace("  chunk_mem_const: 1\n", "  chunk_mem_const: 1\n  chunk_mem_const: 2\n")
    problems = _problems(tmp_path, text)
    assert len(problems) == 2, problems
    assert "bad.yaml:7: key 'chunk_mem_const' written twice" in problems[0]
    assert "bad.yaml:11: skip_logit: unknown key (did you mean 'skip_logits'?)" in problems[1]


def test_a_tab_and_field_errors_are_reported_together(tmp_path):
    text = FIELD_TYPO.replace("  chunk_mem_const: 1", "\tchunk_mem_const: 1")
    problems = _problems(tmp_path, text)
    assert len(problems) == 2, problems
    assert "bad.yaml:6: flce: not valid YAML" in problems[0] and "tab" in problems[0]
    assert "bad.yaml:10: skip_logit: unknown key" in problems[1]


def test_bad_indentation_and_field_errors_of_other_entries_are_reported_together(tmp_path):
    text = FIELD_TYPO.replace("  swiglu:", "   swiglu:").replace(
        "flce:\n  chunk_mem_const: 1", "flce:\n  chunk_mem_const: true"
    )
    text = text.replace("LlamaRMSNorm]}", "LlamaRMSNorm], casting_mode: fp8}")
    problems = _problems(tmp_path, text)
    assert len(problems) == 4, problems
    assert "bad.yaml:9: kernels: not valid YAML" in problems[0]
    rest = "\n".join(problems[1:])
    assert "bad.yaml:6: flce.chunk_mem_const" in rest and "bad.yaml:10: skip_logit: unknown key" in rest
    assert "bad.yaml:8: kernels.rms_norm.casting_mode" in rest  # the entry beside the bad line


def test_a_syntax_error_does_not_hide_a_missing_field(tmp_path):
    problems = _problems(tmp_path, "family: broken\nmodel_types: [broken\n  - x: y\n")
    assert problems[0].startswith(f"{tmp_path / 'bad.yaml'}:2: model_types: not valid YAML")
    rest = "\n".join(problems[1:])
    assert "bad.yaml:1: module: Field required" in rest and "bad.yaml:1: causal_lm: Field required" in rest
    assert "model_types: Field required" not in rest


def test_a_file_of_many_bad_lines_is_given_up_after_a_bounded_number(tmp_path):
    from liger_registry.registry.yaml_source import MAX_SYNTAX_PROBLEMS

    problems = _problems(tmp_path, FIELD_TYPO + "".join(f"\tkey_{i}: 1\n" for i in range(500)))
    assert len(problems) == MAX_SYNTAX_PROBLEMS + 2
    assert f"more than {MAX_SYNTAX_PROBLEMS} lines are not valid YAML" in problems[-1]
