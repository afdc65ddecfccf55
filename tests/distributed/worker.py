"""Run by torchrun (gloo on CPU, or nccl with WORKER_DEVICE=cuda): a patched and an unpatched tiny model under DDP, FSDP2 and FSDP1; writes what
each rank saw (losses, full gradients, whether the head was fused) to $OUT_DIR/rank<r>.json."""

from __future__ import annotations

import gc
import json
import os
import sys

import torch
import torch.distributed as dist

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model

MODES = ("ddp", "fsdp2", "fsdp2_head", "fsdp1", "fsdp1_head")


DEVICE = os.environ.get("WORKER_DEVICE", "cpu")
# bundled families' tiny models, one after the other in the same process group
MODEL_TYPES = os.environ.get("WORKER_MODEL", "llama").split(",")


def wrap(model, mode: str):
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if mode.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        if mode == "fsdp2_head":
            fully_shard(model.lm_head)
        return fully_shard(model)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    classes = {type(model.model.layers[0])} | ({torch.nn.Linear} if mode == "fsdp1_head" else set())
    device_id = torch.cuda.current_device() if DEVICE == "cuda" else None
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy(classes), use_orig_params=True, device_id=device_id)


def full_grads(wrapped, mode: str) -> dict[str, list[float]]:
    if mode == "ddp" or mode.startswith("fsdp2"):
        params = wrapped.module.named_parameters() if mode == "ddp" else wrapped.named_parameters()
        out = {}
        for name, p in params:
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            out[name] = grad.flatten()[:64].tolist()
        return out
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(wrapped, with_grads=True):
        return {
            n.replace("_fsdp_wrapped_module.", ""): p.grad.flatten()[:64].tolist()
            for n, p in wrapped.named_parameters()
        }


def run(model_type: str, mode: str, patch: bool, rank: int) -> dict:
    model = tiny_model(model_type).to(DEVICE)
    handle = L.apply(model) if patch else None
    kinds = sorted({r.kernel for r in handle.report.patched}) if handle is not None else []
    wrapped = wrap(model, mode)
    batch = tiny_batch(model, batch=4, seq=16, seed=1)
    batch = {k: v[2 * rank : 2 * rank + 2].to(DEVICE) for k, v in batch.items()}
    head_calls = []  # the rank of what each call of the head returned: 3 for logits, 0 for a fused loss
    lm_head = model.lm_head
    hook = (lm_head.module if mode == "fsdp1_head" else lm_head).register_forward_hook(
        lambda m, i, o: head_calls.append(o.dim())
    )
    model.train()
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    losses = []
    for step in range(2):
        optimizer.zero_grad()
        loss = wrapped(**batch).loss
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            grads = full_grads(wrapped, mode)
        optimizer.step()
    hook.remove()
    if handle is not None:
        handle.revert()
    return {"losses": losses, "grads": grads, "head_calls": head_calls, "kinds": kinds}


SIDES = ("patched", "unpatched")


def main() -> None:
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    rank = dist.get_rank()
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else MODES
    result = {model_type: {} for model_type in MODEL_TYPES}
    for model_type in MODEL_TYPES:
        for mode in modes:
            got = result[model_type]
            try:
                got[mode] = {side: run(model_type, mode, side == "patched", rank) for side in SIDES}
            except Exception as exc:  # reported per mode, so one unsupported wrapper does not hide the others
                got[mode] = {"error": f"{type(exc).__name__}: {exc}"}
            dist.barrier()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    gc.collect()  # FSDP's reference cycles hold gloo work; freed at interpreter shutdown they abort the rank
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
