"""The family and policy schemas reject what a typo or a wrong type would otherwise hide."""

import typing

import pytest
from pydantic import BaseModel, ValidationError

from liger_registry.schemas import FamilyEntry, PolicyFile

BASE = {"family": "x", "model_types": ["x"], "module": "transformers.models.llama.modeling_llama", "causal_lm": "C"}


def test_minimal_entry_gets_documented_defaults():
    entry = FamilyEntry.model_validate(BASE)
    assert (entry.forward, entry.skip_logits, entry.flce.chunk_mem_const, entry.flce.enabled) == ("causal_lm", "auto", 1, True)


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
