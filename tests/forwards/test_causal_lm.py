"""The installed causal-LM forwards: skip_logits semantics, argument binding, HF loss semantics, outputs."""

import inspect

import pytest
import torch

import liger_registry
from liger_registry.forwards import resolve_skip_logits
from liger_registry.testing import tiny_batch, tiny_model

CORE = ["llama", "mistral", "qwen2", "qwen3", "gpt_oss"]


@pytest.fixture
def pair():
    """(unpatched reference model, patched copy with identical weights)."""
    reference = tiny_model("llama")
    model = tiny_model("llama")
    handle = liger_registry.apply(model)
    yield reference, model
    handle.revert()


@pytest.mark.parametrize(
    "skip, mode, training, labels, fuses, expected",
    [
        (None, "auto", True, True, True, True),
        (None, "auto", False, True, True, False),
        (None, "auto", True, False, True, False),
        (None, "labels", False, True, True, True),
        (None, "never", True, True, True, False),
        (False, "auto", True, True, True, False),
        (True, "never", False, True, True, True),
        # a forward that does not fuse returns the logits it computed, unless asked (or the mode says labels)
        (None, "auto", True, True, False, False),
        (None, "labels", True, True, False, True),
        (True, "auto", True, True, False, True),
    ],
)
def test_resolve_skip_logits(skip, mode, training, labels, fuses, expected):
    assert resolve_skip_logits(skip, mode, training, labels, fuses=fuses) is expected


def test_skip_logits_true_without_labels_is_an_error(pair):
    _, model = pair
    batch = tiny_batch(model)
    with pytest.raises(ValueError, match="needs labels"):
        model(input_ids=batch["input_ids"], skip_logits=True)


def test_training_with_labels_skips_logits_and_matches_loss(pair):
    reference, model = pair
    batch = tiny_batch(model)
    model.train(), reference.train()
    out = model(**batch)
    assert out.logits is None
    torch.testing.assert_close(out.loss, reference(**batch).loss)


def test_skip_logits_false_returns_logits_in_training(pair):
    reference, model = pair
    batch = tiny_batch(model)
    model.train(), reference.train()
    out, ref = model(**batch, skip_logits=False), reference(**batch)
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out.loss, ref.loss)


def test_eval_mode_returns_logits_and_loss(pair):
    reference, model = pair
    batch = tiny_batch(model)
    model.eval(), reference.eval()
    out, ref = model(**batch), reference(**batch)
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out.loss, ref.loss)
    assert type(out) is type(ref)


def test_labels_mode_skips_in_eval():
    model = tiny_model("llama")
    with liger_registry.patched(model, skip_logits="labels"):
        model.eval()
        batch = tiny_batch(model)
        assert model(**batch).logits is None
        assert model(input_ids=batch["input_ids"]).logits is not None


def test_positional_arguments_bind_like_the_original(pair):
    reference, model = pair
    batch = tiny_batch(model)
    model.eval(), reference.eval()
    out = model(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(out.logits, reference(batch["input_ids"], batch["attention_mask"]).logits)


def test_signature_is_the_originals_plus_skip_logits(pair):
    reference, model = pair
    original = list(inspect.signature(reference.forward).parameters)
    installed = list(inspect.signature(model.forward).parameters)
    assert [p for p in installed if p != "skip_logits"] == original
    assert inspect.signature(model.forward).parameters["skip_logits"].kind is inspect.Parameter.KEYWORD_ONLY


def test_num_items_in_batch_sums_then_divides(pair):
    reference, model = pair
    batch = tiny_batch(model)
    batch["labels"][:, :5] = -100
    model.train(), reference.train()
    n = torch.tensor(7)
    torch.testing.assert_close(
        model(**batch, num_items_in_batch=n).loss, reference(**batch, num_items_in_batch=n).loss
    )


@pytest.mark.parametrize("skip_logits", [True, False])
def test_custom_ignore_index_pads_the_shift_with_it(pair, skip_logits):
    """ignore_index=-1: the padded slot past the end is ignored (it was the constant -100, a real label)."""
    reference, model = pair
    batch = tiny_batch(model)
    batch["labels"][:, :3] = -1
    model.train(), reference.train()
    want = reference(**batch, ignore_index=-1).loss
    torch.testing.assert_close(model(**batch, ignore_index=-1, skip_logits=skip_logits).loss, want)


def test_shift_labels_alone_are_a_loss_target(pair):
    """HF computes no loss from shift_labels alone; the patched forward uses them as the targets."""
    reference, model = pair
    batch = tiny_batch(model)
    shift = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    model.train(), reference.train()
    expected = reference(**batch).loss
    out = model(input_ids=batch["input_ids"], shift_labels=shift)
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected)


def test_return_dict_false_gives_a_tuple(pair):
    reference, model = pair
    batch = tiny_batch(model)
    model.eval(), reference.eval()
    out, ref = model(**batch, return_dict=False), reference(**batch, return_dict=False)
    assert isinstance(out, tuple) and len(out) == len(ref)
    torch.testing.assert_close(out[1], ref[1])


def test_logits_to_keep(pair):
    reference, model = pair
    batch = tiny_batch(model)
    model.eval(), reference.eval()
    out = model(input_ids=batch["input_ids"], logits_to_keep=1)
    assert out.logits.shape[1] == 1
    torch.testing.assert_close(out.logits, reference(input_ids=batch["input_ids"], logits_to_keep=1).logits)


def test_moe_router_aux_loss_is_added_as_hf_does():
    reference, model = tiny_model("gpt_oss"), tiny_model("gpt_oss")
    batch = tiny_batch(model)
    with liger_registry.patched(model):
        model.train(), reference.train()
        out = model(**batch, output_router_logits=True)
        ref = reference(**batch, output_router_logits=True)
        assert out.logits is None and out.aux_loss is not None
        torch.testing.assert_close(out.aux_loss, ref.aux_loss)
        torch.testing.assert_close(out.loss, ref.loss)


def _train(model, batches, lr=0.5):
    # SGD, not Adam: Adam normalises near-zero gradients (k_proj's bias cancels in softmax) into noise.
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    model.train()
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("model_type", CORE)
def test_core_family_trains_like_unpatched_in_float32(model_type):
    reference, model = tiny_model(model_type), tiny_model(model_type)
    batches = [tiny_batch(model, seed=s) for s in range(3)]
    with liger_registry.patched(model):
        patched_losses = _train(model, batches)
        expected = _train(reference, batches)
        assert patched_losses == pytest.approx(expected, rel=1e-4, abs=1e-5)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
        model.eval(), reference.eval()
        batch = tiny_batch(model, seed=9)
        torch.testing.assert_close(
            model(**batch, skip_logits=False).logits, reference(**batch).logits, rtol=1e-4, atol=1e-5
        )


def test_fused_lm_head_keyword_without_trls_head_is_refused_with_the_way_out(pair):
    """TRL's trainers pass `fused_lm_head=True` to the head they install; our forward getting it means that head is
    gone: the loss would silently be computed another way than TRL asked, so it is refused."""
    _, model = pair
    with pytest.raises(ValueError, match="TRL's fused-head convention.*Build the TRL trainer"):
        model(**tiny_batch(model), fused_lm_head=True)
