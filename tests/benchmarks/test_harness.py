"""The benchmarks' runner on the CPU: interleaved timing and its statistics, result JSON and CSV, tables, the
entry point ``python -m benchmarks`` and every bench's argument parsing."""

from __future__ import annotations

import csv
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.__main__ import BENCHES

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    """perf_counter that moves only when a toy method runs: each call costs exactly its method's ms."""

    def __init__(self, monkeypatch):
        self.now, self.calls = 0.0, []
        monkeypatch.setattr(harness.time, "perf_counter", lambda: self.now)

    def method(self, name: str, ms: float, fail: bool = False):
        def run():
            if fail:
                raise RuntimeError(f"{name} cannot run")
            self.calls.append(name)
            self.now += ms / 1e3

        return run


def test_measure_warms_up_then_interleaves_in_a_rotated_order(monkeypatch) -> None:
    clock = FakeClock(monkeypatch)
    methods = {"a": clock.method("a", 1.0), "b": clock.method("b", 3.0), "c": clock.method("c", 2.0)}
    timings = harness.measure(methods, warmup=2, repeats=4, cuda=False)
    assert {k: t.median for k, t in timings.items()} == pytest.approx({"a": 1.0, "b": 3.0, "c": 2.0})
    assert all(t.spread == pytest.approx(0.0) and len(t.samples) == 4 for t in timings.values())
    # one first call and 2 warm-up calls per method, before any timed call
    assert clock.calls[:9] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    rounds = [clock.calls[9 + 3 * i : 12 + 3 * i] for i in range(4)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_measure_with_ms_budgets_counts_calls_from_an_estimate(monkeypatch) -> None:
    clock = FakeClock(monkeypatch)
    harness.measure({"a": clock.method("a", 2.0)}, warmup_ms=10.0, rep_ms=40.0, cuda=False)
    # first call, 3 estimate calls, 10 / 2 warm-up calls, 40 / 2 timed calls
    assert len(clock.calls) == 1 + 3 + 5 + 20


def test_measure_leaves_out_a_failing_method_and_says_why(monkeypatch) -> None:
    clock = FakeClock(monkeypatch)
    errors: dict = {}
    methods = {"ok": clock.method("ok", 1.0), "bad": clock.method("bad", 1.0, fail=True)}
    timings = harness.measure(methods, warmup=0, repeats=2, cuda=False, errors=errors)
    assert list(timings) == ["ok"] and "cannot run" in str(errors["bad"])
    with pytest.raises(RuntimeError, match="cannot run"):  # without a place for errors, it propagates
        harness.measure(methods, warmup=0, repeats=2, cuda=False)


def test_measure_drops_the_named_gradients_before_every_call(monkeypatch) -> None:
    import torch

    x = torch.ones(3, requires_grad=True)
    seen = []

    def step():
        seen.append(x.grad is None)
        (x * 2).sum().backward()

    harness.measure({"step": step}, warmup=1, repeats=3, grad_to_none=[x], cuda=False)
    assert seen == [True] * 5


def test_timing_median_and_spread() -> None:
    t = harness.Timing((5.0, 1.0, 3.0, 2.0, 4.0))
    assert t.median == 3.0
    assert t.spread == pytest.approx((4.0 - 2.0) / 3.0)  # interquartile range over the median
    assert t.as_dict() == {"median_ms": 3.0, "spread": t.spread, "min_ms": 1.0, "max_ms": 5.0, "n": 5}
    assert harness.Timing((7.0,)).spread == 0.0


def test_time_steps_and_the_steady_median(monkeypatch) -> None:
    clock = FakeClock(monkeypatch)
    costs = [50.0, 10.0, 12.0, 11.0]  # the first step compiles

    def step(i):
        clock.now += costs[i] / 1e3
        return i * 10

    values, seconds = harness.time_steps(step, 4, cuda=False)
    assert values == [0, 10, 20, 30] and seconds == pytest.approx([c / 1e3 for c in costs])
    assert harness.steady_median(seconds, 1) == pytest.approx(0.011)
    assert harness.steady_median(seconds, 9) == pytest.approx(0.0115)  # no steps after the warm-up: all


def test_peak_memory_is_none_off_cuda() -> None:
    assert harness.peak_mib(lambda: None) is None


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
        (None, "cpu"),
        ("cpu", "cpu"),
    ],
)
def test_device_slug(name, slug) -> None:
    assert harness.device_slug(name) == slug


def test_capture_env_names_versions_and_commit() -> None:
    env = harness.capture_env("cpu")
    assert env["device_slug"] == "cpu" and env["torch"] and env["transformers"]
    assert env["commit"] is None or len(env["commit"]) >= 7


def test_the_commit_named_in_the_environment_wins(monkeypatch) -> None:
    monkeypatch.setenv(harness.COMMIT_VARIABLE, "6bca3fa")
    assert harness.capture_env()["commit"] == "6bca3fa"


ENV = {"device": "NVIDIA H100 80GB HBM3", "device_slug": "h100", "commit": "abc1234"}
ENV |= {"torch": "2.13.0", "triton": "3.9.0", "transformers": "5.25.0"}


def test_results_json_name_and_csv_rows(tmp_path: Path) -> None:
    results = harness.Results("flce", tmp_path, env=ENV)
    results.add("llama BT=2048", "ours", "ms", 1.5)
    results.add("llama BT=2048", "liger", "ms", None)  # a failed run: no row
    results.add("llama BT=2048", "ours", "ok", True)  # not a number: no row
    path = results.write({"rows": [{"method": "ours", "ms": 1.5}]})
    assert path == tmp_path / f"bench_flce_h100_{results.date}.json"
    data = json.loads(path.read_text())
    assert data["env"] == ENV and data["rows"] == [{"method": "ours", "ms": 1.5}]
    tagged = harness.Results("step", tmp_path, env=ENV, tag="dense")
    tagged.add("llama3_2_1b 2x4096", "hf", "tps", 12345)
    tagged.write({})
    assert tagged.path("png", "_tps").name == f"bench_step-dense_h100_{tagged.date}_tps.png"
    with (tmp_path / "measurements.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(harness.CSV_COLUMNS)  # the header once, then the rows of both runs
    assert rows[1:] == [
        [
            results.date,
            "abc1234",
            "h100",
            "2.13.0",
            "3.9.0",
            "5.25.0",
            "flce",
            "llama BT=2048",
            "ours",
            "ms",
            "1.5",
        ],
        [tagged.date, "abc1234", "h100", "2.13.0", "3.9.0", "5.25.0", "step", "llama3_2_1b 2x4096", "hf"]
        + ["tps", "12345.0"],
    ]


def test_table_aligns_formats_and_marks_missing_values() -> None:
    cols = [("method", ""), ("ms", ".2f"), ("ok", ""), ("tok/s", ">")]
    text = harness.table(cols, [["ours", 1.234, True, "12.3k"], ["liger", None, False, None]], "title")
    assert text.splitlines() == [
        "title",
        "method    ms  ok   tok/s",
        "------  ----  ---  -----",
        "ours    1.23  yes  12.3k",
        "liger      -  no       -",
    ]
    markdown = harness.table(cols, [["ours", 1.234, True, "12.3k"]], markdown=True).splitlines()
    assert markdown == ["| method | ms | ok | tok/s |", "|---|---|---|---|", "| ours | 1.23 | yes | 12.3k |"]


def test_plot_without_matplotlib_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = harness.plot(lambda plt: None, tmp_path / "x.png")
    assert out.startswith("not drawn (") and not (tmp_path / "x.png").exists()
    assert "plot skipped" in capsys.readouterr().out


def test_list_names_every_bench() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()[2:]]
    assert (
        listed == ["ops", "flce", "moe", "e2e", "step", "distributed", "compile", "rl_head"] == list(BENCHES)
    )
    unknown = subprocess.run(
        [sys.executable, "-m", "benchmarks", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "unknown bench 'nope'" in unknown.stderr


@pytest.mark.parametrize("name", list(BENCHES))
def test_every_bench_parses_its_arguments(name, capsys) -> None:
    module = importlib.import_module(BENCHES[name][0])
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    assert "--out" in capsys.readouterr().out  # every bench writes where it is told


def test_no_module_of_the_package_edits_sys_path() -> None:
    edits = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "benchmarks").rglob("*.py")
        if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()
    ]
    assert edits == []


def test_a_probe_json_is_named_by_device_and_date_in_out(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path))
    path = harness.write_probe("row_stats", {"rows": [1]}, tag="llama")
    assert path.parent == tmp_path and path.name.startswith("probe_row_stats-llama_cpu_")
    data = json.loads(path.read_text())
    assert data["rows"] == [1] and data["env"]["device_slug"] == "cpu"
