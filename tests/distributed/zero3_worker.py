"""Run by torchrun: a patched and an unpatched tiny model under DeepSpeed ZeRO-3 (every parameter partitioned,
none kept whole), SGD steps on rank-specific data; writes each rank's losses and how often the head made logits."""

from __future__ import annotations

import json
import os

import deepspeed
import torch

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model

DEVICE = os.environ.get("WORKER_DEVICE", "cpu")
STEPS = 3
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True,
}


def run(patch: bool, rank: int) -> dict:
    model = tiny_model("llama")
    if patch:
        L.apply(model)
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), config=CONFIG
    )
    assert L.unwrap_model(engine) is model
    head = model.lm_head.weight
    partitioned = getattr(head, "ds_id", None) is not None and head.data.numel() == 0
    calls = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: calls.append(o.dim()))
    engine.train()
    losses = []
    for step in range(STEPS):
        batch = {k: v.to(engine.device) for k, v in tiny_batch(model, seed=10 * step + rank).items()}
        out = engine(**batch)
        losses.append(out.loss.item())
        engine.backward(out.loss)
        engine.step()
    hook.remove()
    return {"losses": losses, "head_outputs": calls, "partitioned": partitioned}


def main() -> None:
    deepspeed.init_distributed(dist_backend="nccl" if DEVICE == "cuda" else "gloo")
    rank = torch.distributed.get_rank()
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    result = {}
    try:
        result["zero3"] = {"patched": run(True, rank), "unpatched": run(False, rank)}
    except Exception as exc:
        result["zero3"] = {"error": f"{type(exc).__name__}: {exc}"}
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
