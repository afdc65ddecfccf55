"""DDP, FSDP2 (fully_shard) and FSDP1 on a patched model: same losses and gradients as unpatched, the head fused.

CPU: two gloo processes, DDP and FSDP2 (FSDP1 refuses CPU-only machines). GPU (one or more): every mode, nccl.
"""

from __future__ import annotations

import pytest
import torch
from dist_launch import launch

CPU_MODES = ["ddp", "fsdp2", "fsdp2_head"]
GPU_MODES = ["ddp", "fsdp2", "fsdp2_head", "fsdp1", "fsdp1_head"]


def check(results: list[dict], modes: list[str]) -> None:
    for rank, result in enumerate(results):
        for mode in modes:
            got = result[mode]
            assert "error" not in got, f"rank {rank} {mode}: {got.get('error')}"
            patched, unpatched = got["patched"], got["unpatched"]
            assert patched["losses"] == pytest.approx(unpatched["losses"], rel=1e-5), (rank, mode)
            assert patched["grads"].keys() == unpatched["grads"].keys()
            for name, grad in patched["grads"].items():
                assert grad == pytest.approx(unpatched["grads"][name], rel=1e-3, abs=1e-6), (rank, mode, name)
            assert 3 not in patched["head_calls"], f"{mode}: the patched model materialised logits"
            assert unpatched["head_calls"] == [3, 3]
    for mode in modes:  # data parallel: every rank holds the same averaged gradients
        first = results[0][mode]["patched"]["grads"]
        for other in results[1:]:
            for name, grad in other[mode]["patched"]["grads"].items():
                assert grad == pytest.approx(first[name], rel=1e-5, abs=1e-7), (mode, name)


MOE = ("qwen3_moe", "gpt_oss")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
def test_ddp_and_fsdp2_on_two_cpu_processes(tmp_path):
    """Llama, then the experts kernel on the parameters DDP replicates and FSDP2 shards per layer (3-D stacked
    weights; GPT-OSS: transposed, with biases), in one launch: the same losses and gradients as unpatched on every
    rank."""
    results = launch(tmp_path, CPU_MODES, nproc=2, env_extra={"WORKER_MODEL": ",".join(("llama", *MOE))})
    for model_type in ("llama", *MOE):
        check([r[model_type] for r in results], CPU_MODES)
    for model_type in MOE:
        assert all(
            "moe_experts" in r[model_type][mode]["patched"]["kinds"] for r in results for mode in CPU_MODES
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (nccl)")
def test_every_mode_on_the_gpus(tmp_path):
    nproc = torch.cuda.device_count()
    check([r["llama"] for r in launch(tmp_path, GPU_MODES, nproc=nproc, device="cuda")], GPU_MODES)
