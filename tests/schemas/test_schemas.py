"""The family and policy schemas reject what a typo or a wrong type would otherwise hide."""

import typing

import pytest
from pydantic import BaseModel, ValidationError

from liger_registry.schemas import FamilyEntry, PolicyFile

BASE = {
    "family": "x",
    "model_types": ["x"],
    "module": "transformers.models.llama.modeling_llama",
    "causal_lm": "C",
}


def test_minimal_entry_gets_documented_defaults():
    entry = FamilyEntry.model_validate(BASE)
    assert (entry.forward, entry.skip_logits, entry.flce.chunk_mem_const, entry.flce.enabled) == (
        "causal_lm",
        "auto",
        1,
        True,
    )


@pytest.mark.parametrize(
    "patch",
    [
        {"flce": {"chunk_mem_const": True}},
        {"flce": {"chunk_mem_const": 0}},
        {"flce": {"chunk_mem_const": "8"}},
        {"skip_logits": "sometimes"},
        {"module": "os.path"},
        {"transformers": "five"},
        {"kernels": {"rms_norm": {"targets": ["A"], "casting_mode": "fp8"}}},
        {"kernels": {"rms_norm": {"targets": []}}},
        {"kernels": {"rms_norm": {"targets": ["os.path:join"]}}},
        {"kernels": {"rmsnorm": {"targets": ["A"]}}},
        {"extra_key": 1},
    ],
)
def test_bad_values_are_rejected(patch):
    with pytest.raises(ValidationError):
        FamilyEntry.model_validate({**BASE, **patch})


def _submodels(annotation):
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def test_every_field_is_described_recursively():
    seen, todo, missing = set(), [FamilyEntry, PolicyFile], []
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            todo += _submodels(field.annotation)
    assert len(seen) > 10 and missing == []


def test_policy_requires_reason_and_scope():
    with pytest.raises(ValidationError):
        PolicyFile.model_validate({"policy": "p", "flce": {"chunk_mem_const": 4}})
    policy = PolicyFile.model_validate({"policy": "p", "applies_to": ["*"], "reason": "r"})
    assert policy.applies("anything")


def test_policy_field_of_another_kind_is_refused_by_name(tmp_path):
    from liger_registry.registry.errors import RegistryError
    from liger_registry.registry.loader import load_policy

    path = tmp_path / "p.yaml"
    path.write_text("policy: p\napplies_to: [llama]\nreason: r\nkernels:\n  swiglu: {casting_mode: gemma}\n")
    with pytest.raises(RegistryError) as info:
        load_policy(path)
    assert (
        "p.yaml:5: kernels.swiglu.casting_mode: swiglu has no field 'casting_mode'; allowed: enabled, reason"
        in str(info.value)
    )
    path.write_text(
        "policy: p\napplies_to: [llama]\nreason: r\nkernels:\n  rms_norm: {casting_mode: gemma}\n"
    )
    assert load_policy(path).policy.kernels.rms_norm.casting_mode == "gemma"


def test_kinds_table_derives_specs_patches_and_overrides():
    from liger_registry.schemas import KINDS, LIGER_KEYS, OVERRIDE_PATHS, KernelsPatch, KernelsSpec, Overrides

    assert list(KernelsSpec.model_fields) == list(KINDS) == list(KernelsPatch.model_fields)
    for name, kind in KINDS.items():
        assert OVERRIDE_PATHS[name] == f"kernels.{name}.enabled" and name in Overrides.model_fields
        patch = KernelsPatch.model_fields[name].annotation.__args__[0]
        assert set(patch.model_fields) == {"enabled", "reason", *kind.patchable}
    assert set(LIGER_KEYS) == {k.liger_key for k in KINDS.values() if k.liger_key} | {
        "cross_entropy",  # the head's losses: sections read by the forward, not kinds
        "fused_linear_cross_entropy",
    }


def test_yaml_errors_speak_of_fields_not_of_pydantic_types(tmp_path):
    """A field typed as a union (max_chunk_mib: whole MiB or a fraction) gets one problem in plain words, not
    one per member labelled with pydantic's internal type names (`constrained-int`)."""
    from liger_registry.registry.errors import RegistryError
    from liger_registry.registry.loader import load_policy

    path = tmp_path / "p.yaml"
    path.write_text("policy: p\napplies_to: [llama]\nreason: r\nflce: {max_chunk_mib: lots}\n")
    with pytest.raises(RegistryError) as info:
        load_policy(path)
    assert info.value.problems == [
        f"{path}:4: flce.max_chunk_mib: Input should be a valid integer or a valid number"
    ]
    path.write_text("policy: p\napplies_to: [llama]\nreason: r\nflce: {max_chunk_mib: -2}\n")
    with pytest.raises(RegistryError) as info:
        load_policy(path)
    [problem] = info.value.problems
    assert problem.startswith(f"{path}:4: flce.max_chunk_mib: ") and "constrained" not in problem
