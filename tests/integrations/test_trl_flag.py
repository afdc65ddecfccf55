"""TRL's own `use_liger_kernel=True` (SFT, DPO, GRPO as installed) inside `use_liger_kernel_flag()`.

TRL (1.x) wraps the model's forward with its fused LM head when the trainer is built and passes
`liger_kernel_config={..., "fused_linear_cross_entropy": False}` to the hook Trainer.train() calls. Routed to
liger_registry, the decoder kernels are installed under TRL's head and TRL's head is kept (the report says
why the forward is not replaced). The logged losses and metrics equal the same trainer's without
`use_liger_kernel`, in fp32: at step 1 to rel 1e-5 (the same weights; the kernels' CPU references round a few sums
in another order); at step 2 to rel 1e-4, since AdamW's first step (lr 1e-2) is about lr * sign(grad) for a
gradient near Adam's eps, so gradients that differ in the last bits move a few weights differently (DPO shows it;
its rewards are differences of log-probabilities, hence also abs 1e-4).
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from integration_helpers import args
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import liger_registry as L
from liger_registry.integrations import use_liger_kernel_flag
from liger_registry.testing import tiny_model

trl = pytest.importorskip("trl")

DECODER_KERNELS = {"rms_norm", "rope", "swiglu"}
# on CUDA the decoder kernels run their Triton code (the H200 check of this route)
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
    ),
]


def tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="t1", pad_token="t2", unk_token="t0")


def text(generator: torch.Generator, vocab: int, n: int) -> str:
    return " ".join(f"t{i}" for i in torch.randint(3, vocab, (n,), generator=generator).tolist())


def sft_trainer(tmp_path, model, **config):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (8, 12), generator=generator).tolist()
    return trl.SFTTrainer(
        model=model,
        args=args(tmp_path, cls=trl.SFTConfig, max_steps=2, **config),
        train_dataset=Dataset.from_dict({"input_ids": ids}),
        processing_class=tokenizer(model.config.vocab_size),
    )


def dpo_trainer(tmp_path, model, **config):
    vocab, generator = model.config.vocab_size, torch.Generator().manual_seed(0)
    data = {
        "prompt": [text(generator, vocab, 3 + i % 3) for i in range(8)],
        "chosen": [" " + text(generator, vocab, 2 + i % 4) for i in range(8)],
        "rejected": [" " + text(generator, vocab, 1 + i % 3) for i in range(8)],
    }
    return trl.DPOTrainer(
        model=model,
        ref_model=tiny_model("llama", seed=1),
        args=args(
            tmp_path, cls=trl.DPOConfig, max_steps=2, per_device_train_batch_size=4, beta=0.2, **config
        ),
        train_dataset=Dataset.from_dict(data),
        processing_class=tokenizer(vocab),
    )


def reward_t5(completions, **kwargs) -> list[float]:
    return [float(c.split().count("t5")) - 0.1 * len(c.split()) for c in completions]


def grpo_trainer(tmp_path, model, **config):
    vocab, generator = model.config.vocab_size, torch.Generator().manual_seed(0)
    prompts = [text(generator, vocab, 4) for _ in range(4)]
    grpo_args = args(
        tmp_path,
        cls=trl.GRPOConfig,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        beta=0.0,  # no reference model: TRL would load one by the tiny model's (empty) name
        **config,
    )
    return trl.GRPOTrainer(
        model=model,
        reward_funcs=reward_t5,
        args=grpo_args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer(vocab),
    )


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize(
    "build, metrics",
    [
        (sft_trainer, ["loss", "mean_token_accuracy", "entropy"]),
        (dpo_trainer, ["loss", "rewards/chosen", "rewards/margins"]),
        (grpo_trainer, ["loss", "entropy", "reward", "completions/mean_length"]),
    ],
    ids=["sft", "dpo", "grpo"],
)
@pytest.mark.parametrize("device", DEVICES)
def test_trl_use_liger_kernel_trains_through_the_flag_route(tmp_path, build, metrics, device):
    reference = build(tmp_path, tiny_model("llama"), use_cpu=device == "cpu")
    reference.train()
    model = tiny_model("llama")
    with use_liger_kernel_flag() as handles:
        trainer = build(tmp_path, model, use_liger_kernel=True, use_cpu=device == "cpu")
        trainer.train()
    try:
        assert len(handles) == 1 and L.patch_handle(model) is handles[0]
        report = handles[0].report
        assert DECODER_KERNELS <= {r.kernel for r in report.patched}
        assert "trl" in report.skipped["forward"] and "fused LM head" in report.skipped["forward"]
        for key in metrics:
            want, got = logged(reference, key), logged(trainer, key)
            assert len(want) == 2, key
            assert got[0] == pytest.approx(want[0], rel=1e-5, abs=1e-6), key
            assert got == pytest.approx(want, rel=1e-4, abs=1e-4), key
    finally:
        L.revert(model)


def test_a_model_patched_before_the_trainer_keeps_its_patch_under_the_flag(tmp_path):
    """TRL adds fused_linear_cross_entropy=False to the config to keep its head on top; applied first, the patch
    is under TRL's head already, so that key agrees with it and the patch (fused loss included) is kept."""
    reference = sft_trainer(tmp_path, tiny_model("llama"))
    reference.train()
    model = tiny_model("llama")
    handle = L.apply(model)
    with use_liger_kernel_flag() as handles:
        trainer = sft_trainer(tmp_path, model, use_liger_kernel=True)
        trainer.train()
    assert handles == [] and L.patch_handle(model) is handle
    assert logged(trainer, "loss") == pytest.approx(logged(reference, "loss"), rel=1e-5)
    handle.revert()
