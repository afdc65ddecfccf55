"""DeepSpeed ZeRO-3 on a patched model: the head's partitioned weight is gathered by calling the head module, the
loss is fused (no logits) and training follows the unpatched model step for step. CPU: two gloo processes
(DeepSpeed's CPU accelerator); GPU: nccl on every GPU. Skipped where DeepSpeed is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from dist_launch import launch

WORKER = Path(__file__).with_name("zero3_worker.py")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)


def check(results: list[dict]) -> None:
    for rank, result in enumerate(results):
        got = result["zero3"]
        assert "error" not in got, f"rank {rank}: {got.get('error')}"
        patched, unpatched = got["patched"], got["unpatched"]
        assert patched["partitioned"] and unpatched["partitioned"], (
            "ZeRO-3 kept the head whole: nothing tested"
        )
        assert patched["losses"] == pytest.approx(unpatched["losses"], rel=1e-5), rank
        assert 3 not in patched["head_outputs"], "the patched model materialised logits"
        assert patched["head_outputs"], "the fused loss must call the head module (so ZeRO-3 gathers it)"
        assert unpatched["head_outputs"] == [3] * len(unpatched["losses"])
    assert results[0]["zero3"]["patched"]["losses"] != results[1]["zero3"]["patched"]["losses"]  # own data


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
def test_zero3_on_two_cpu_processes(tmp_path):
    check(
        launch(tmp_path, ["zero3"], nproc=2, worker=WORKER, env_extra={"DS_ACCELERATOR": "cpu"}, timeout=400)
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (nccl)")
def test_zero3_on_the_gpus(tmp_path):
    check(
        launch(
            tmp_path, ["zero3"], nproc=torch.cuda.device_count(), device="cuda", worker=WORKER, timeout=400
        )
    )
