"""FusedDPOTrainer: TRL's DPOTrainer with the fused DPO loss gives TRL's own loss on a batch and trains on CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from liger_registry.testing import tiny_model

trl = pytest.importorskip("trl")
from liger_registry.alignment.trl_dpo import FusedDPOTrainer  # noqa: E402


def _tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="t1", pad_token="t2", unk_token="t0")


def _data(vocab: int, n: int = 8) -> Dataset:
    g = torch.Generator().manual_seed(0)

    def text(k):
        return " ".join(f"t{i}" for i in torch.randint(3, vocab, (k,), generator=g).tolist())

    return Dataset.from_dict(
        {
            "prompt": [text(3 + i % 3) for i in range(n)],
            "chosen": [" " + text(2 + i % 4) for i in range(n)],
            "rejected": [" " + text(1 + i % 3) for i in range(n)],
        }
    )


def _trainer(cls, tmp_path, model, ref_model, **config):
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        beta=0.2,
        **config,
    )
    vocab = model.config.vocab_size
    return cls(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=_data(vocab),
        processing_class=_tokenizer(vocab),
    )


def test_the_loss_is_trl_dpo_loss_on_the_same_batch(tmp_path):
    model, ref = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    fused = _trainer(FusedDPOTrainer, tmp_path, model, ref)
    plain = _trainer(trl.DPOTrainer, tmp_path, copy.deepcopy(model), copy.deepcopy(ref))
    inputs = next(iter(fused.get_train_dataloader()))
    assert (inputs["completion_mask"] == 0).any()  # prompts and padding are masked
    got = fused.compute_loss(fused.model, inputs)
    want = plain.compute_loss(plain.model, inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got.backward()
    want.backward()
    for (name, p), q in zip(fused.model.named_parameters(), plain.model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_it_trains_a_tiny_model_on_cpu_and_logs_the_rewards(tmp_path):
    model, ref = tiny_model("llama", seed=0), tiny_model("llama", seed=0)
    before = model.lm_head.weight.detach().clone()
    trainer = _trainer(FusedDPOTrainer, tmp_path, model, ref)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logged)
    assert "rewards/accuracies" in logged[0] and "rewards/margins" in logged[0]
    assert not torch.equal(before, model.lm_head.weight)


def test_unsupported_dpo_options_are_refused(tmp_path):
    model, ref = tiny_model("llama"), tiny_model("llama")
    with pytest.raises(ValueError, match="loss_type"):
        _trainer(FusedDPOTrainer, tmp_path, model, ref, loss_type=["ipo"])


def test_a_peft_model_uses_its_reference_adapter_like_trl(tmp_path):
    peft = pytest.importorskip("peft")

    def lora():
        config = peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        )
        return peft.get_peft_model(tiny_model("llama", seed=0), config)

    torch.manual_seed(0)
    fused = _trainer(FusedDPOTrainer, tmp_path, lora(), None)
    torch.manual_seed(0)
    plain = _trainer(trl.DPOTrainer, tmp_path, lora(), None)
    for trainer in (fused, plain):  # TRL copies the adapter as "ref": move the trained one away from it
        assert "ref" in trainer.model.peft_config
        for name, p in trainer.model.named_parameters():
            if "lora_B.default" in name:
                p.data.add_(0.5)
    inputs = next(iter(fused.get_train_dataloader()))
    got = fused.compute_loss(fused.model, inputs)
    want = plain.compute_loss(plain.model, inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert abs(got.item() - 0.6931) > 1e-3  # the policy is not its reference
