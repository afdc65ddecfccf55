"""The benchmark scripts import on the CPU, and the e2e step probe reads a profiler trace right (GPU busy/idle, gaps,
host lead and tail, kernel kinds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import probe_e2e_step as probe  # noqa: E402


def _trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [dict(ph="X", **e) for e in events]}))
    return str(path)


def test_trace_summary_counts_gpu_time_once_and_finds_the_gaps(tmp_path):
    events = [
        dict(
            cat="cpu_op", ts=-500, dur=2000, name="aten::mm"
        ),  # host: 0.5 ms before, 1.3 ms after the kernels
        dict(cat="kernel", ts=0, dur=100, name="nvjet_sm90_gemm"),
        dict(cat="kernel", ts=50, dur=100, name="_stats_kernel"),  # overlaps the first: busy counts it once
        dict(cat="gpu_memcpy", ts=150, dur=50, name="Memcpy DtoH"),
        dict(cat="kernel", ts=500, dur=200, name="flash_bprop"),  # 300 us idle before it
    ]
    s = probe.trace_summary(_trace(tmp_path, events))
    assert s["span_ms"] == pytest.approx(0.7)
    assert s["busy_ms"] == pytest.approx(0.4)
    assert s["idle_ms"] == pytest.approx(0.3)
    # the gap, the kernels either side, and the host op that ran during it (0.3 ms of its span)
    assert s["longest"][0] == (0.3, "Memcpy DtoH", "flash_bprop", ["aten::mm 0.30"])
    assert s["lead_ms"] == pytest.approx(0.5) and s["tail_ms"] == pytest.approx(0.8)
    assert s["kinds_ms"]["gemm"] == pytest.approx(0.1) and s["kinds_ms"]["attention"] == pytest.approx(0.2)
    assert s["kernels"][0] == (pytest.approx(0.2), 1, "flash_bprop")


def test_trace_summary_without_kernels(tmp_path):
    assert (
        probe.trace_summary(_trace(tmp_path, [dict(cat="cpu_op", ts=0, dur=5, name="x")]))["idle_ms"] is None
    )


@pytest.mark.parametrize(
    "script", sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))
)
def test_every_benchmark_script_imports(script):
    """Each benchmark and probe imports on the CPU (names they take from the package still exist)."""
    import importlib

    module = importlib.import_module(script)
    assert callable(getattr(module, "main", None)) or script in ("common", "force_flce_strategy")
