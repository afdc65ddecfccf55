"""Absurd numbers (chunk_mem_const=10**30, a 1e300 MiB budget, an ignore_index past int64) are refused where they
are written, with the allowed range: YAML schema, policy, keyword override, direct kernel call."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from liger_registry import kernels as K
from liger_registry.registry.errors import RegistryError
from liger_registry.registry.resolve import validate_overrides
from liger_registry.schemas import FamilyEntry, PolicyFile

ABSURD_FLCE = [
    {"chunk_mem_const": 10**30},
    {"chunk_mem_const": 2**20 + 1},
    {"max_chunk_mib": 1e300},
    {"max_chunk_mib": 10**30},
]
ENTRY = {"family": "x", "model_types": ["x"], "module": "transformers.models.x", "causal_lm": "X"}


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize("knobs", ABSURD_FLCE, ids=str)
def test_absurd_budget_refused_by_every_layer(knobs, cases) -> None:
    ((name, value),) = knobs.items()
    cases.tried(4)
    with pytest.raises(ValidationError, match="less than or equal to"):
        FamilyEntry.model_validate({**ENTRY, "flce": knobs})
    with pytest.raises(ValidationError, match="less than or equal to"):
        PolicyFile.model_validate({"policy": "p", "applies_to": ["*"], "reason": "r", "flce": knobs})
    with pytest.raises(RegistryError) as info:
        validate_overrides(knobs)
    assert "less than or equal to" in str(info.value.problems)
    with pytest.raises(ValueError, match=r"in \[1, 1048576\]|in \(0, 1\.07374e\+09\]"):
        K.fused_linear_cross_entropy(torch.randn(2, 4), torch.randn(3, 4), torch.tensor([0, 1]), **knobs)


@pytest.mark.reliability("raw_exception")
def test_absurd_jsd_chunk_refused(cases) -> None:
    cases.tried(3)
    with pytest.raises(ValidationError, match="less than or equal to"):
        FamilyEntry.model_validate({**ENTRY, "fused_linear_jsd": {"chunk_mem_const": 10**30}})
    with pytest.raises(RegistryError):
        validate_overrides({"jsd_chunk_mem_const": 10**30})
    h, w = torch.randn(2, 4), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"\[1, 1048576\]"):
        K.fused_linear_jsd(h, w, h, w, torch.tensor([0, 1]), chunk_mem_const=10**30)


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize(
    "options",
    [{"ignore_index": 10**30}, {"ignore_index": -(2**64)}, {"softcap": 1e308}, {"logit_scale": 1e308}],
    ids=str,
)
def test_absurd_loss_options_refused(options, cases) -> None:
    h, w, t = torch.randn(2, 4), torch.randn(3, 4), torch.tensor([0, 1])
    cases.tried()
    with pytest.raises(ValueError, match="must be in"):
        K.fused_linear_cross_entropy(h, w, t, **options)
    if "logit_scale" not in options:
        cases.tried()
        with pytest.raises(ValueError, match="must be in"):
            K.cross_entropy(h @ w.t(), t, **options)


@pytest.mark.reliability("raw_exception")
def test_largest_allowed_values_still_run(cases) -> None:
    cases.tried()
    h, w, t = torch.randn(2, 4), torch.randn(3, 4), torch.tensor([0, 1])
    ref = K.fused_linear_cross_entropy(h, w, t)
    torch.testing.assert_close(K.fused_linear_cross_entropy(h, w, t, chunk_mem_const=2**20), ref)
    torch.testing.assert_close(K.fused_linear_cross_entropy(h, w, t, max_chunk_mib=2**30), ref)
