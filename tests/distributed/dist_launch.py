"""Starts tests/distributed/worker.py under torchrun and collects what every rank wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
# NVLink multicast stays off on the GPU machines, also for the children torchrun starts
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    tmp_path: Path,
    modes: list[str],
    nproc: int,
    device: str = "cpu",
    timeout: int = 240,
    worker: Path = WORKER,
    env_extra: dict[str, str] | None = None,
) -> list[dict]:
    env = {
        **os.environ,
        **NO_MULTICAST,
        "OUT_DIR": str(tmp_path),
        "WORKER_DEVICE": device,
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        str(worker),
        ",".join(modes),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise AssertionError(
            f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]
