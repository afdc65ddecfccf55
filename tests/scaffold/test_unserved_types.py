"""The scaffold on model types no bundled family serves: a fixed-seed sample of the installed transformers'
unserved types, plus three that once went wrong (vaultgemma's head softcap, cohere2_moe's LayerNorm, lfm2_moe's
unset layer_types). Each ends proven (and then matches the unpatched model under the perturbation check), drafted
but not proven (naming the attribute), or refused with a message, never with a raw exception."""

import random
import re

import pytest

from liger_registry.registry import load_registry
from liger_registry.scaffold import scaffold
from liger_registry.scaffold.draft import MissingConfig, Refused
from liger_registry.scaffold.inspect import causal_lm_types
from liger_registry.scaffold.perturb import MOVED, TOLERANCE

ALWAYS = ("vaultgemma", "cohere2_moe", "lfm2_moe")
SAMPLED = 6


def _unserved() -> list[str]:
    return sorted(set(causal_lm_types()) - set(load_registry().by_model_type))


def _sample() -> list[str]:
    others = [t for t in _unserved() if t not in ALWAYS]
    return [t for t in ALWAYS if t in _unserved()] + random.Random(0).sample(
        others, min(SAMPLED, len(others))
    )


def _rel(a: float, b: float) -> float:
    return abs(a - b) / (1 + abs(b))


def _check_proven(result) -> None:
    check = result.proof.perturbation
    assert check.ok, check.problems()
    base_want, base_got = check.base
    assert _rel(base_got, base_want) <= TOLERANCE
    for attr in check.named:  # each attribute the entry reads moved the unpatched loss, and the patched alike
        tried = [p for p in check.tried if p.attr == attr]
        assert tried and _rel(tried[-1].want, base_want) > MOVED, (attr, tried)
    for p in check.tried:
        assert p.got is not None and _rel(p.got, p.want) <= TOLERANCE, p


def _check_refused(result) -> None:
    assert isinstance(result.refusal, Refused) and result.reasons and result.reasons[0].strip()
    # a message says what failed, not only the exception: never a bare "TypeError: ..."
    assert not re.match(r"^\w*(Error|Exception)\b", result.reasons[0]), result.reasons[0]


@pytest.mark.parametrize("model_type", _sample())
def test_unserved_type_is_proven_or_not_proven_or_refused_with_a_message(model_type):
    result = scaffold(model_type)  # never raises: every outcome is a result
    assert result.status in ("proven", "not proven", "refused")
    if result.ok:
        _check_proven(result)
    elif result.unproven:
        assert any("could not pin down" in r for r in result.reasons), result.reasons
    else:
        _check_refused(result)
    if model_type == "vaultgemma":
        assert result.ok and result.entry.head.softcap_attr == "final_logit_softcapping"
        assert "final_logit_softcapping" in result.proof.perturbation.named
    elif model_type == "cohere2_moe":
        assert result.ok and result.entry.kernels.layer_norm.enabled  # a LayerNorm without bias is served
    elif model_type == "lfm2_moe":
        assert isinstance(result.refusal, MissingConfig) and "layer_types" in result.refusal.fields
