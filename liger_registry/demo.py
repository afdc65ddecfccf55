"""The demo: a tiny Llama trained a few steps unpatched and patched, with the losses and the report."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import liger_registry
from liger_registry.console import print_table, progress


def _model(seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _train(model: LlamaForCausalLM, batches: list[torch.Tensor], label: str) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for input_ids in progress(batches, len(batches), f"training {label}"):
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def run_demo(steps: int = 5, seed: int = 0) -> tuple[list[float], list[float]]:
    """Train the same tiny Llama twice from one init; return (unpatched, patched) losses."""
    generator = torch.Generator().manual_seed(seed)
    # Two fixed batches, seen in turn: a tiny model can learn them, so the loss visibly goes down.
    data = [torch.randint(0, 512, (4, 64), generator=generator) for _ in range(2)]
    batches = [data[i % 2] for i in range(steps)]
    baseline = _train(_model(seed), batches, "unpatched")
    model = _model(seed)
    handle = liger_registry.apply(model)
    patched = _train(model, batches, "patched")
    print(handle.report)
    rows = [
        [str(i), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.2e}"]
        for i, (a, b) in enumerate(zip(baseline, patched, strict=True))
    ]
    print_table(["step", "unpatched loss", "patched loss", "|diff|"], rows, title="tiny Llama, float32, CPU")
    handle.revert()
    print("reverted:", "forward" not in vars(model))
    return baseline, patched
