"""A model type no family serves: an error that says how to add one, or with strict=False a warning and the model
left exactly as it was (it then trains unpatched, as with the reference library)."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import liger_registry
from liger_registry.registry.errors import UnsupportedModelError


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64)
    return GPT2LMHeadModel(config)


def own_attributes(model) -> list[dict]:
    return [dict(vars(m)) for m in model.modules()]


def test_gpt2_is_not_served():
    assert "gpt2" not in liger_registry.load_registry().by_model_type


@pytest.mark.parametrize("target", ["model", "model_type"])
def test_strict_is_an_error_naming_the_scaffold_command(target):
    model = tiny_gpt2()
    with pytest.raises(UnsupportedModelError, match="liger-registry scaffold gpt2"):
        liger_registry.apply(model if target == "model" else "gpt2")


@pytest.mark.parametrize("target", ["model", "model_type"])
def test_not_strict_is_a_warning_and_nothing_is_patched(target):
    model = tiny_gpt2()
    before = own_attributes(model)
    forward = GPT2LMHeadModel.forward
    with pytest.warns(UserWarning, match="liger-registry scaffold gpt2") as caught:
        handle = liger_registry.apply(model if target == "model" else "gpt2", strict=False)
    assert handle is None
    assert "unpatched" in str(caught[0].message)
    assert own_attributes(model) == before and GPT2LMHeadModel.forward is forward
    assert liger_registry.patch_handle(model) is None and liger_registry.patch_handle("gpt2") is None


def test_patched_block_on_an_unsupported_model_yields_none():
    model = tiny_gpt2()
    with (
        pytest.warns(UserWarning, match="scaffold gpt2"),
        liger_registry.patched(model, strict=False) as handle,
    ):
        assert handle is None
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert liger_registry.patch_handle(model) is None
