"""The proof can fail: distinct knob values, the perturbation check, unset config fields and `--set`."""

import importlib
import itertools

import pytest
from transformers import AutoConfig

from liger_registry import cli
from liger_registry.scaffold import draft, prove
from liger_registry.scaffold.cli import parse_setting
from liger_registry.scaffold.draft import MissingConfig, Refused
from liger_registry.scaffold.perturb import knob_attrs, override, read

draft_module = importlib.import_module("liger_registry.scaffold.draft")


def _floats(values: dict, prefix: str = "") -> dict[str, float]:
    """Every float of a tiny config, lists and nested mappings included, by path."""
    found = {}
    for name, value in values.items():
        if isinstance(value, float):
            found[prefix + name] = value
        elif isinstance(value, list):
            found |= {f"{prefix}{name}[{i}]": v for i, v in enumerate(value) if isinstance(v, float)}
        elif isinstance(value, dict):
            found |= _floats(value, f"{prefix}{name}.")
    return found


@pytest.mark.parametrize("model_type", ["vaultgemma", "gemma3_text", "falcon_h1", "cohere2_moe"])
def test_every_knob_of_the_tiny_config_has_its_own_value(model_type):
    """Softcaps, multipliers, scales, epsilons and rope thetas: no two equal, none the reciprocal of another,
    so that a formula reading one of them is told apart from one reading another."""
    tiny, _ = draft_module.tiny_overrides(AutoConfig.for_model(model_type))
    knobs = {
        k: v for k, v in _floats(tiny).items() if "partial_rotary_factor" not in k and "drop" not in k and v
    }
    assert len(knobs) >= 2, knobs
    for (a, x), (b, y) in itertools.combinations(knobs.items(), 2):
        assert x != pytest.approx(y) and x * y != pytest.approx(1.0), (a, x, b, y)


def test_the_softcaps_and_epsilon_of_vaultgemma_differ():
    tiny, candidates = draft_module.tiny_overrides(AutoConfig.for_model("vaultgemma"))
    assert tiny["attn_logit_softcapping"] != tiny["final_logit_softcapping"]
    assert tiny["rms_norm_eps"] not in (1e-6, tiny["attn_logit_softcapping"])
    assert sorted(candidates) == ["attn_logit_softcapping", "final_logit_softcapping"]


def test_a_head_reading_the_wrong_softcap_is_not_proven_even_on_equal_values():
    """The blindness: with both softcaps equal in the tiny config, a head that softcaps with the attention's
    value matches the unpatched model step for step. Changing each softcap in turn shows the patched model does
    not follow the final one (and follows the attention one where the model does not)."""
    entry = draft("vaultgemma").entry
    assert entry.head.softcap_attr == "final_logit_softcapping"
    wrong = entry.model_copy(
        update={
            "head": entry.head.model_copy(update={"softcap_attr": "attn_logit_softcapping"}),
            "tiny_config": {
                **entry.tiny_config,
                "attn_logit_softcapping": 5.0,
                "final_logit_softcapping": 5.0,
            },
        }
    )
    proof = prove(wrong)
    assert proof.parity_ok  # the parity run alone is blind to it
    assert not proof.ok
    assert any("could not pin down final_logit_softcapping" in p for p in proof.problems()), proof.problems()


def test_knob_paths_reach_into_nested_mappings_and_overrides_keep_the_rest():
    tiny = {"a": 1.5, "drop": 0.0, "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}}
    assert knob_attrs(tiny) == ["a", "rope_parameters.rope_theta"]
    config = AutoConfig.for_model("llama")
    assert read(config, "rope_parameters.rope_theta") == config.rope_parameters["rope_theta"]
    changed = override(config, "rope_parameters.rope_theta", 7.0)
    assert changed["rope_parameters"] == {**config.rope_parameters, "rope_theta": 7.0}


def test_a_field_the_default_config_leaves_unset_is_named_not_raised():
    """LFM2-MoE's default config has layer_types None and its decoder layer indexes it: the refusal names the
    field, the line that reads it and the option that gives it, instead of the TypeError."""
    with pytest.raises(MissingConfig) as caught:
        draft("lfm2_moe")
    assert caught.value.fields.keys() == {"layer_types"}
    message = str(caught.value)
    assert "NoneType" not in message and "--set layer_types=" in message and "modeling_lfm2_moe.py" in message


def test_set_gives_the_missing_field_and_the_draft_carries_it():
    drafted = draft("lfm2_moe", settings={"layer_types": ["conv", "full_attention"]}).entry
    assert drafted.tiny_config["layer_types"] == ["conv", "full_attention"]
    assert (
        drafted.kernels.swiglu.enabled and drafted.kernels.swiglu.act_config_attr is None
    )  # silu hard-coded


def test_set_of_a_field_the_config_lacks_is_refused_with_a_suggestion():
    with pytest.raises(Refused, match="no field 'layer_type'.*did you mean 'layer_types'"):
        draft("lfm2_moe", settings={"layer_type": ["conv"]})


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("a=3", ("a", 3)),
        ("a=-2", ("a", -2)),
        ("a=0.5", ("a", 0.5)),
        ("a=1e-6", ("a", 1e-6)),
        ("a=True", ("a", True)),
        ("a=false", ("a", False)),
        ("a=null", ("a", None)),
        ('a=["conv", "full_attention"]', ("a", ["conv", "full_attention"])),
        ('a.b={"rope_theta": 10.0}', ("a.b", {"rope_theta": 10.0})),
        ("a=silu", ("a", "silu")),
    ],
)
def test_set_values_are_parsed_as_what_they_look_like(text, want):
    assert parse_setting(text) == want


@pytest.mark.parametrize("text", ["novalue", "=3", "a b=3", "a=[1, 2"])
def test_malformed_set_is_a_usage_error(text, capsys):
    assert cli.main(["scaffold", "llama", "--set", text]) == 2
    assert "--set" in capsys.readouterr().err


def test_set_goes_with_a_model_type_only(capsys):
    assert cli.main(["scaffold", "--all", "--set", "a=1"]) == 2
    assert "--set" in capsys.readouterr().err


class _Config:
    def __init__(self, **values):
        self.__dict__.update(values)

    def to_dict(self):
        return dict(self.__dict__)


class _Indexer:
    """A field read through an attribute its __init__ copied from the config, as Qwen4ExpTextQSAIndexer does."""

    def __init__(self, config):
        self.token_budget = config.token_budget
        self.block = self.token_budget // 2


def test_a_field_read_through_an_attribute_copied_from_the_config_is_named():
    config = _Config(token_budget=None, hidden_size=32)
    with pytest.raises(TypeError) as caught:
        _Indexer(config)
    found = draft_module.missing_fields(caught.value, [config])
    assert list(found) == ["token_budget"] and "self.token_budget // 2" in found["token_budget"]
    assert isinstance(draft_module.refusal("cannot build", caught.value, [config]), MissingConfig)
    other = draft_module.refusal("cannot build", ValueError("x"), [config])
    assert type(other) is Refused and str(other) == "cannot build: ValueError: x"
