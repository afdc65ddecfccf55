"""The forwards table: a name is taken once; a second forward under it is an error naming both."""

import pytest

from liger_registry.forwards import registry as forward_table
from liger_registry.forwards.registry import get_forward, register_forward


def impostor(self, ctx, *args, skip_logits=None, **kwargs):
    return None


def test_a_second_forward_under_a_registered_name_is_an_error_naming_both():
    builtin = get_forward("causal_lm").fn
    with pytest.raises(ValueError) as info:
        register_forward("causal_lm")(impostor)
    message = str(info.value)
    assert f"{builtin.__module__}.{builtin.__qualname__}" in message and f"{__name__}.impostor" in message
    assert get_forward("causal_lm").fn is builtin


def test_a_builtin_name_is_taken_before_its_module_is_imported(monkeypatch):
    """A plugin's entry point loads before any built-in forward is imported: its `causal_lm` would otherwise
    replace ours for every family, silently."""
    monkeypatch.setattr(forward_table, "_FORWARDS", {})
    with pytest.raises(
        ValueError, match=r"'causal_lm' is the built-in forward of liger_registry\.forwards\.causal_lm"
    ):
        register_forward("causal_lm")(impostor)
    assert forward_table._FORWARDS == {}


def test_registering_the_same_function_again_is_allowed(monkeypatch):
    monkeypatch.setattr(forward_table, "_FORWARDS", dict(forward_table._FORWARDS))
    register_forward("mine_once")(impostor)
    register_forward("mine_once")(impostor)
    assert get_forward("mine_once").fn is impostor
