"""Default positions: a patched model called without position_ids builds its masks without transformers'
packed-sequence check (no host sync in eager, SDPA's is_causal under torch.compile), with the same loss."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import masking_utils
from transformers.models.llama.modeling_llama import LlamaModel

import liger_registry
from liger_registry.forwards.positions import default_positions_call
from liger_registry.testing import compiled_sdpa_masks, loss_and_grads, tiny_model


def _batch(model, seq: int = 16) -> dict[str, torch.Tensor]:
    ids = torch.randint(
        0, model.config.get_text_config().vocab_size, (2, seq), generator=torch.Generator().manual_seed(0)
    )
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.fixture
def packed_checks(monkeypatch):
    """How many times transformers looked for packed sequences in the positions."""
    calls = []
    original = masking_utils.find_packed_sequence_indices

    def spy(position_ids):
        calls.append(position_ids)
        return original(position_ids)

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", spy)
    return calls


@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe", "gemma2"])
def test_default_positions_skip_the_packed_check_with_the_same_loss_and_gradients(model_type, packed_checks):
    # gemma2: a sliding window shorter than the rows, so the sliding-window masks are built and used
    reference = tiny_model(model_type, use_cache=False, sliding_window=4)
    model = tiny_model(model_type, use_cache=False, sliding_window=4)
    batch = _batch(model)
    want_loss, want_grads = loss_and_grads(reference, reference, batch)
    assert packed_checks, "the unpatched model looks for packed sequences (else this test proves nothing)"
    packed_checks.clear()
    with liger_registry.patched(model):
        loss, grads = loss_and_grads(model, model, batch)
    assert not packed_checks
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("model_type", ["llama", "mistral3"])  # mistral3: the masks are its text model's
def test_packed_positions_keep_transformers_packed_masks(model_type, packed_checks):
    reference, model = tiny_model(model_type, use_cache=False), tiny_model(model_type, use_cache=False)
    batch = _batch(model)
    # two sequences packed in each row: attention must not cross from the first into the second
    packed = {**batch, "position_ids": torch.cat([torch.arange(6), torch.arange(10)]).expand(2, -1)}
    want = reference(**packed).loss
    with liger_registry.patched(model):
        got = model(**packed).loss
        default = model(**batch).loss
    assert len(packed_checks) == 2  # the reference's and the patched model's packed call
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, default)  # the packed mask changed the loss: it was applied


def test_the_default_positions_forward_checks_positions_it_is_given(packed_checks):
    from liger_registry.forwards.positions import DEFAULT_POSITIONS
    from liger_registry.registry.positions import default_positions_forward

    model = tiny_model("llama", use_cache=False)
    ids = _batch(model)["input_ids"]
    packed = torch.cat([torch.arange(6), torch.arange(10)]).expand(2, -1)
    forward = default_positions_forward(LlamaModel)
    want = model.model(input_ids=ids, position_ids=packed).last_hidden_state
    packed_checks.clear()
    got = forward(
        model.model, input_ids=ids, position_ids=packed, **{DEFAULT_POSITIONS: True}
    ).last_hidden_state
    assert len(packed_checks) == 1
    torch.testing.assert_close(got, want)


def test_compiled_default_positions_run_sdpa_causal_as_eager_does():
    reference = tiny_model("llama", use_cache=False, _attn_implementation="sdpa")
    model = tiny_model("llama", use_cache=False, _attn_implementation="sdpa")
    batch = _batch(model)
    unpatched = compiled_sdpa_masks(reference, batch)
    with liger_registry.patched(model):
        patched = compiled_sdpa_masks(model, batch)
    assert unpatched and all(unpatched)  # the packed-sequence check keeps a mask in every layer
    assert patched == [False] * len(unpatched)  # eager's masks: none, SDPA's is_causal


def test_compiled_default_positions_keep_the_masks_eager_mode_keeps():
    """A sliding window shorter than the rows, eager attention, a padding mask: the mask stays, as in eager."""
    for overrides, batch_extra in (
        ({"_attn_implementation": "sdpa", "sliding_window": 4}, {}),
        ({"_attn_implementation": "eager"}, {}),
        ({"_attn_implementation": "sdpa"}, {"attention_mask": torch.ones(2, 16, dtype=torch.long)}),
    ):
        model = tiny_model("mistral", use_cache=False, **overrides)
        batch = {**_batch(model), **batch_extra}
        reference = copy.deepcopy(model)
        with liger_registry.patched(model):
            masks = compiled_sdpa_masks(model, batch)
            got = model(**batch).loss
        assert all(masks), overrides
        torch.testing.assert_close(got, reference(**batch).loss, rtol=1e-5, atol=1e-6)


def test_only_text_calls_without_positions_take_the_default_positions():
    ids = torch.zeros(1, 4, dtype=torch.long)
    assert default_positions_call({"input_ids": ids, "attention_mask": None}, {"use_cache": False})
    assert not default_positions_call({"input_ids": ids, "position_ids": ids}, {})
    assert not default_positions_call({"input_ids": ids}, {"position_ids": ids})
    assert not default_positions_call({"input_ids": ids, "pixel_values": torch.zeros(1)}, {})
    assert not default_positions_call({"input_ids": ids}, {"token_type_ids": ids})


def test_reverted_and_copied_models_run_the_original_forward(packed_checks):
    model = tiny_model("llama", use_cache=False)
    batch = _batch(model)
    handle = liger_registry.apply(model)
    model(**batch)
    assert not packed_checks
    copied = copy.deepcopy(model)  # its switches belong to the original: it runs transformers' forwards
    torch.testing.assert_close(copied(**batch).loss, model(**batch).loss, rtol=1e-5, atol=1e-6)
    assert len(packed_checks) == 1
    handle.revert()
    assert "forward" not in vars(model.model)
    model(**batch)
    assert len(packed_checks) == 2


def test_class_wide_patches_take_the_default_positions_too(packed_checks):
    """By model type (liger-kernel's apply_liger_kernel_to_llama() before loading): the base model class gets the
    forward class-wide; the same loss, no packed-sequence check, and reverted with the rest."""
    original = vars(LlamaModel)["forward"]
    reference = tiny_model("llama", use_cache=False)
    batch = _batch(reference)
    want = reference(**batch).loss
    packed_checks.clear()
    with liger_registry.patched("llama") as handle:
        assert any(
            "LlamaModel.forward(masks of default positions)" in r.target for r in handle.report.patched
        )
        model = tiny_model("llama", use_cache=False)
        torch.testing.assert_close(model(**batch).loss, want, rtol=1e-5, atol=1e-6)
        assert not packed_checks
        model.model(input_ids=batch["input_ids"])  # the base model alone: transformers' forward
        assert len(packed_checks) == 1
    assert vars(LlamaModel)["forward"] is original
    torch.testing.assert_close(model(**batch).loss, want, rtol=1e-5, atol=1e-6)
    assert len(packed_checks) == 2


def _families_with_a_head() -> list[str]:
    from liger_registry.registry.loader import load_registry

    return sorted(name for name, f in load_registry().families.items() if f.entry.head is not None)


@pytest.mark.parametrize("family", _families_with_a_head())
def test_every_family_called_without_positions_matches_its_padding_mask_call(family, packed_checks):
    """Every family's training call without positions, mask or cache (the default-positions path) against the
    same patched model given an all-ones padding mask (transformers' own forward and masks): one step's loss and
    gradients, fp32, and no packed-sequence check where our forward calls the base model (also for the forwards
    that build their masks in a lambda, and for multimodal base models that hand the text model its masks'
    inputs). The parity suite's calls pass the padding mask, so they do not take this path."""
    import transformers

    from liger_registry.forwards.registry import get_forward
    from liger_registry.registry.loader import load_registry
    from liger_registry.registry.targets import version_problem
    from liger_registry.testing import rel_diff

    entry = load_registry().families[family].entry
    if why := entry.broken_on(transformers.__version__) or version_problem(entry):
        pytest.skip(why)
    model = tiny_model(entry.model_types[0], use_cache=False)
    batch = _batch(model)
    with liger_registry.patched(model):
        want_loss, want_grads = loss_and_grads(
            model, model, {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
        )
        packed_checks.clear()
        loss, grads = loss_and_grads(model, model, batch)
    if get_forward(entry.forward).fuses:  # the others keep transformers' causal-LM forward
        assert not packed_checks
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-6)
    worst = max(rel_diff(grads[n], g, floor=1e-6) for n, g in want_grads.items())
    assert worst <= 1e-5, worst
