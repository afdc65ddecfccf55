"""Layering: defaults < family < bundled policy < user policy < overrides, each knob with its source."""

import pytest
from packaging.specifiers import SpecifierSet

import liger_registry
from liger_registry.kernels import flce_chunk_geometry
from liger_registry.registry.errors import RegistryError
from liger_registry.registry.targets import supported_range

CORE = ["llama", "mistral", "qwen2", "qwen3"]


def test_gpt_oss_gets_c8_from_its_bundled_policy():
    explanation = liger_registry.explain("gpt_oss")
    assert explanation.value("flce.chunk_mem_const") == 8
    source = explanation.source("flce.chunk_mem_const")
    assert (source.layer, source.name) == (3, "gpt_oss")


@pytest.mark.parametrize("model_type", CORE)
def test_other_families_get_c1(model_type):
    explanation = liger_registry.explain(model_type)
    assert explanation.value("flce.chunk_mem_const") == 1
    assert explanation.config.policies == []


def test_user_policy_then_override_win_in_order(tmp_path):
    policy = tmp_path / "mine.yaml"
    policy.write_text(
        "policy: mine\napplies_to: [llama]\nreason: test\nflce: {chunk_mem_const: 4}\nskip_logits: labels\n"
    )
    explanation = liger_registry.explain("llama", policy=policy)
    assert (
        explanation.value("flce.chunk_mem_const") == 4
        and explanation.source("flce.chunk_mem_const").layer == 4
    )
    assert explanation.value("skip_logits") == "labels"
    overridden = liger_registry.explain("llama", policy=policy, chunk_mem_const=16)
    assert (
        overridden.value("flce.chunk_mem_const") == 16
        and overridden.source("flce.chunk_mem_const").layer == 5
    )
    assert overridden.source("kernels.rms_norm.targets").layer == 2
    assert (
        overridden.source("kernels.rms_norm.casting_mode").layer == 1
    )  # llama.yaml leaves it to defaults.yaml
    assert overridden.source("kernels.rms_norm.eps_attr").layer == 1


def test_user_policy_scoped_to_other_family_does_not_apply(tmp_path):
    policy = tmp_path / "other.yaml"
    policy.write_text("policy: other\napplies_to: [qwen3]\nreason: test\nflce: {chunk_mem_const: 4}\n")
    assert liger_registry.explain("llama", policy=policy).value("flce.chunk_mem_const") == 1


def test_flce_policy_leaves_jsd_knob_alone():
    explanation = liger_registry.explain("gpt_oss")
    assert explanation.value("fused_linear_jsd.chunk_mem_const") == 1


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"chunk_mem_cosnt": 2}, "did you mean 'chunk_mem_const'"),
        ({"chunk_mem_const": True}, "chunk_mem_const"),
        ({"chunk_mem_const": 0}, "chunk_mem_const"),
        ({"skip_logits": "always"}, "skip_logits"),
        ({"geglu": True}, "has no geglu kernel; its switches: rms_norm, add_rms_norm, rope, swiglu"),
    ],
)
def test_bad_overrides_are_errors(overrides, match):
    with pytest.raises(RegistryError, match=match):
        liger_registry.explain("llama", **overrides)


@pytest.mark.parametrize("c, expected", [(1, (256, 32)), (8, (2048, 4)), (16, (4096, 2))])
def test_design_chunk_geometries(c, expected):
    assert flce_chunk_geometry(8192, 4096, 128256, chunk_mem_const=c) == expected


def test_defaults_file_is_layer_one_and_families_state_only_what_differs():
    from liger_registry.schemas.defaults import DEFAULTS_FILE, default

    registry = liger_registry.load_registry()
    explanation = liger_registry.explain("llama")
    assert explanation.source("skip_logits").layer == 1 and "defaults.yaml" in str(
        explanation.source("skip_logits")
    )
    for loaded in registry.families.values():
        entry, text = loaded.entry, loaded.path.read_text()
        # One edit in DEFAULTS_FILE bumps every family: a family only narrows the default range, by a lower bound
        # (InternLM3: a type only 5.24 registers), and states it only then.
        assert set(SpecifierSet(default("transformers"))) <= set(supported_range(entry))
        narrowed = entry.transformers != default("transformers")
        assert not narrowed or all(s.operator == ">=" for s in SpecifierSet(entry.transformers))
        assert (
            narrowed or "transformers:" not in text.replace("transformers: decoder", "")
        ) and "forward: causal_lm\n" not in text
        assert "skip_logits: auto" not in text and "casting_mode: llama" not in text
    assert DEFAULTS_FILE.name == "defaults.yaml"


def test_a_registry_policy_says_where_it_came_from(tmp_path, monkeypatch):
    policy = "policy: {name}\napplies_to: [llama]\nreason: r\nflce: {{chunk_mem_const: {c}}}\n"
    (tmp_path / "env").mkdir(), (tmp_path / "dir").mkdir()
    (tmp_path / "env" / "p.yaml").write_text(policy.format(name="from_env", c=2))
    (tmp_path / "dir" / "p.yaml").write_text(policy.format(name="from_dir", c=3))
    monkeypatch.setenv("LIGER_REGISTRY_PATH", str(tmp_path / "env"))
    registry = liger_registry.load_registry()
    explanation = liger_registry.explain("llama", registry=registry)
    assert str(explanation.source("flce.chunk_mem_const")) == "LIGER_REGISTRY_PATH policy from_env (p.yaml)"
    registry = liger_registry.load_registry(tmp_path / "dir")
    explanation = liger_registry.explain("llama", registry=registry)
    assert str(explanation.source("flce.chunk_mem_const")) == "directory policy from_dir (p.yaml)"
    assert str(liger_registry.explain("gpt_oss").source("flce.chunk_mem_const")).startswith(
        "bundled policy gpt_oss"
    )


@pytest.mark.parametrize("policy", [{"flce": {"chunk_mem_const": 8}}, 3, [None]])
def test_a_policy_that_is_no_name_or_path_is_a_registry_error(policy):
    """Not a TypeError from deep inside pathlib: the message says what `policy=` takes."""
    with pytest.raises(RegistryError, match="policy must be a bundled policy name, a YAML file path"):
        liger_registry.explain("llama", policy=policy)
