"""The probes: each imports on the CPU and opens with its question and the design page of its answer; the e2e step
probe reads a profiler trace right (GPU busy/idle, gaps, host lead and tail, kernel kinds)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from benchmarks.probes import e2e_step as probe

PROBES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "benchmarks" / "probes").glob("*.py"))


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


@pytest.mark.parametrize("name", [p for p in PROBES if p != "__init__"])
def test_every_probe_imports_and_names_its_question_and_page(name):
    """Each probe imports on the CPU (the names it takes from the package still exist), has a main, and its
    docstring opens with the question it answers and the design page that records the answer."""
    module = importlib.import_module(f"benchmarks.probes.{name}")
    assert callable(getattr(module, "main", None))
    question, page = module.__doc__.splitlines()[:2]
    assert question.startswith("Question: ") and question.endswith("?")
    assert re.fullmatch(r"Answer recorded in docs/design/[a-z0-9-]+\.md\.", page), page
