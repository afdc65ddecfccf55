"""Shared pieces of the integration tests: tiny datasets, Trainer arguments, counting lm_head calls."""

from __future__ import annotations

import contextlib

import torch
from transformers import TrainingArguments

from liger_registry.testing import tiny_batch


def rows(model, n: int = 8, seq: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    batch = tiny_batch(model, batch=n, seq=seq, seed=seed)
    batch["labels"][:, :3] = -100  # a prompt that is not trained on
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def args(tmp_path, cls=TrainingArguments, **kw) -> TrainingArguments:
    """Quiet, CPU-only, seeded arguments of a Trainer (``cls``: TrainingArguments or a TRL config)."""
    base = dict(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    base.update(kw)
    return cls(**base)


def losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@contextlib.contextmanager
def count_calls(module: torch.nn.Module):
    """Counts the forward calls of a module (the lm_head: a call materialises logits)."""
    calls = []
    hook = module.register_forward_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        hook.remove()


def tiny_gpt2():
    """A tiny model of a type no bundled family serves (GPT-2)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64))
