"""TRL SFTTrainer on a patched model, and the token accuracy the forward returns when asked.

Installed TRL (1.x) wraps the model's forward with its own fused LM head when the SFTTrainer is built and
computes `mean_token_accuracy` from that head's `is_top1`; older TRL passed `return_token_accuracy=True` and
read `outputs.token_accuracy` (liger's convention), which the patched forward also serves.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from integration_helpers import args
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model

trl = pytest.importorskip("trl")


def tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="t1", pad_token="t2", unk_token="t0")


def sft(tmp_path, model, steps: int = 3):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (8, 12), generator=gen).tolist()
    data = Dataset.from_dict({"input_ids": ids})
    config = args(tmp_path, cls=trl.SFTConfig, max_steps=steps)
    return trl.SFTTrainer(
        model=model, args=config, train_dataset=data, processing_class=tokenizer(model.config.vocab_size)
    )


def history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_sft_trainer_losses_and_token_accuracy_match_unpatched(tmp_path):
    reference = sft(tmp_path, tiny_model("llama"))
    reference.train()
    model = tiny_model("llama")
    with L.patched(model):  # before building the SFTTrainer: TRL wraps the patched forward
        trainer = sft(tmp_path, model)
        trainer.train()
    assert len(history(reference, "mean_token_accuracy")) == 3
    assert history(trainer, "loss") == pytest.approx(history(reference, "loss"), rel=1e-5)
    assert history(trainer, "mean_token_accuracy") == pytest.approx(history(reference, "mean_token_accuracy"))


def test_applying_fused_loss_after_the_sft_trainer_is_built_is_a_clear_error(tmp_path):
    model = tiny_model("llama")
    sft(tmp_path, model, steps=1)
    trl_head = vars(model)["forward"]
    with pytest.raises(L.PatchError, match="TRL's fused LM head") as info:
        L.apply(model)
    assert "apply before building the TRL trainer" in str(info.value)
    assert "fused_linear_cross_entropy=False" in str(info.value)
    assert vars(model)["forward"] is trl_head and L.patch_handle(model) is None


def test_decoder_kernels_go_under_the_head_of_a_built_sft_trainer(tmp_path):
    reference = sft(tmp_path, tiny_model("llama"))
    reference.train()
    model = tiny_model("llama")
    trainer = sft(tmp_path, model)
    trl_head = vars(model)["forward"]
    with L.patched(model, fused_linear_cross_entropy=False) as handle:
        assert vars(model)["forward"] is trl_head
        assert {"rms_norm", "rope", "swiglu"} <= {r.kernel for r in handle.report.patched}
        assert "TRL's fused LM head" in handle.report.skipped["forward"]
        trainer.train()
    assert history(trainer, "loss") == pytest.approx(history(reference, "loss"), rel=1e-5)


@pytest.mark.parametrize("skip_logits", [True, False])
def test_forward_returns_token_accuracy_when_asked(skip_logits):
    model = tiny_model("llama")
    batch = tiny_batch(model, batch=2, seq=16)
    batch["labels"][:, :4] = -100
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    batch["labels"][:, 1::2] = logits[:, :-1:2].argmax(-1)  # every other label is the model's own prediction
    target = batch["labels"][:, 1:]
    valid = target != -100
    expected = ((logits[:, :-1].argmax(-1) == target) & valid).sum() / valid.sum()
    assert 0.3 < expected < 1
    with L.patched(model):
        out = model(**batch, return_token_accuracy=True, skip_logits=skip_logits)
        plain = model(**batch, skip_logits=skip_logits)
    assert torch.allclose(out.token_accuracy, expected.float())
    assert (out.logits is None) == skip_logits
    assert "token_accuracy" not in plain
    assert torch.allclose(out.loss, plain.loss)
