"""CPU smoke run of the RL head benchmark (``python -m benchmarks rl_head --cpu-smoke``): every row it can run on
CPU runs, ratios and the agreement with TRL's head are filled in, the JSON and the CSV are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import rl_head as bench


def test_rl_head_cpu_smoke(tmp_path: Path, capsys) -> None:
    pytest.importorskip("trl")
    argv = ["--cpu-smoke", "--shapes", "qwen3_1_7b", "--tokens", "64", "--warmup", "1", "--repeats", "2"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    assert "largest relative difference" in capsys.readouterr().out.rstrip().splitlines()[-1]
    (path,) = tmp_path.glob("bench_rl_head_cpu_*.json")
    rows = {r["method"]: r for r in json.loads(path.read_text())["rows"]}
    assert set(rows) == set(bench.METHODS)
    assert rows["liger flce"] == {**rows["liger flce"], "ok": False, "error": "liger needs CUDA"}
    for name in set(bench.METHODS) - {"liger flce"}:
        assert rows[name]["ok"] and rows[name]["ms"] > 0, rows[name]
    assert rows["trl"]["x_trl"] == 1.0 and rows["ours"]["x_full_logits"] > 0
    assert max(rows["ours"]["vs_trl_rel"].values()) < 1e-5  # fp32: the same numbers as TRL's head
    csv_rows = (tmp_path / "measurements.csv").read_text().splitlines()
    assert any(",rl_head,qwen3_1_7b N=64,ours,ms," in line for line in csv_rows)


def test_unknown_method_is_refused(capsys) -> None:
    assert bench.main(["--cpu-smoke", "--methods", "ours,mystery"]) == 2
    assert "mystery" in capsys.readouterr().out


def test_every_row_name_has_a_loss() -> None:
    for name in bench.METHODS:
        assert callable(bench.method_loss(name))


def test_an_out_of_memory_row_leaves_no_frames_behind() -> None:
    import gc
    import weakref

    import torch

    held = []

    def fails():
        big = torch.empty(8)
        held.append(weakref.ref(big))
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError) as caught:
        bench.without_frames(fails)()
    gc.collect()
    assert held[0]() is None and caught.value.__context__ is None  # the failed call's tensors are freed
