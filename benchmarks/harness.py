"""The benchmarks' shared runner: timing, peak memory, environment, tables, plots, result files.

Rules every bench follows through this module:
- timing: each method warms up, then the methods' timed calls are interleaved (a rotated order every round),
  so a clock or thermal drift lands on every method alike; a method's time is the median of its calls, with the
  spread (interquartile range over the median) beside it;
- memory: the peak allocated during one call minus what was allocated before it (the inputs are not counted);
- results: one JSON per run, ``<bench>_<device>_<yyyy-mm-dd>.json`` in the output directory, and one row per
  measurement appended to ``<out>/measurements.csv``; ratios are taken against peers measured in the same run.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results"
CSV_NAME = "measurements.csv"
CSV_COLUMNS = (
    "date",
    "commit",
    "device",
    "torch",
    "triton",
    "transformers",
    "bench",
    "case",
    "method",
    "metric",
    "value",
)
L2_FLUSH_BYTES = 256 * 2**20  # larger than the L2 of the GPUs we measure on: each call starts cold


# --- arguments -----------------------------------------------------------------------------------------------


def add_out_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="directory of the results JSON, PNG and measurements.csv"
    )


def out_dir(out: str | Path | None = None) -> Path:
    path = Path(out) if out else DEFAULT_OUT
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- timing --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """The per-call times of one method (ms) and their summary."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 for fewer than 2 samples)."""
        if len(self.samples) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (q3 - q1) / self.median if self.median else 0.0

    def as_dict(self) -> dict:
        return {
            "median_ms": self.median,
            "spread": self.spread,
            "min_ms": min(self.samples),
            "max_ms": max(self.samples),
            "n": len(self.samples),
        }


def _is_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


class _Clock:
    """Times one call: CUDA events from an idle GPU (a cold L2 before each call), perf_counter on the CPU."""

    def __init__(self, cuda: bool, flush_l2: bool):
        import torch

        self.torch, self.cuda = torch, cuda
        self.flush = (
            torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if cuda and flush_l2 else None
        )
        self.pending: list[tuple[list[float], object, object]] = []

    def call(self, fn: Callable[[], object], sink: list[float]) -> None:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            sink.append((time.perf_counter() - start) * 1e3)
            return
        if self.flush is not None:
            self.flush.zero_()
        # an idle GPU when the call starts: queued behind a slower method, a host-bound call would be timed by its
        # kernels alone, its launch overhead hidden
        self.torch.cuda.synchronize()
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        self.pending.append((sink, start, end))

    def collect(self) -> None:
        if self.pending:
            self.torch.cuda.synchronize()
        for sink, start, end in self.pending:
            sink.append(start.elapsed_time(end))
        self.pending.clear()


def _clear(tensors: Iterable) -> None:
    for t in tensors:
        t.grad = None


def _counts(fn, clock, grads, warmup, repeats, warmup_ms, rep_ms) -> tuple[int, int]:
    """Warm-up and timed calls of one method: given, or from ms budgets and a first estimate of a call."""
    if warmup_ms is None and rep_ms is None:
        return warmup, repeats
    probe: list[float] = []
    for _ in range(3):
        _clear(grads)
        clock.call(fn, probe)
    clock.collect()
    est = max(statistics.median(probe), 1e-3)
    n_warm = max(1, round((warmup_ms or 0.0) / est)) if warmup_ms is not None else warmup
    n_rep = min(1000, max(5, round(rep_ms / est))) if rep_ms is not None else repeats
    return n_warm, n_rep


def measure(
    methods: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    repeats: int = 10,
    warmup_ms: float | None = None,
    rep_ms: float | None = None,
    grad_to_none: Sequence = (),
    flush_l2: bool = True,
    cuda: bool | None = None,
    errors: dict[str, BaseException] | None = None,
) -> dict[str, Timing]:
    """Time every method: each warms up, then their calls are interleaved round by round in a rotated order.

    Counts are either fixed (``warmup``, ``repeats``) or budgets in ms of running (``warmup_ms``, ``rep_ms``).
    ``grad_to_none`` tensors have their gradients dropped before every call (a backward that accumulates
    would otherwise add a read). A method that raises is left out and its exception stored in ``errors``
    when given, else it propagates."""
    cuda = _is_cuda() if cuda is None else cuda
    clock = _Clock(cuda, flush_l2)
    plan: dict[str, int] = {}
    for name, fn in methods.items():
        try:
            _clear(grad_to_none)
            fn()  # compiles / autotunes before any estimate
            n_warm, n_rep = _counts(fn, clock, grad_to_none, warmup, repeats, warmup_ms, rep_ms)
            for _ in range(n_warm):
                _clear(grad_to_none)
                fn()
            if cuda:
                clock.torch.cuda.synchronize()
        except Exception as exc:
            clock.pending.clear()  # the failed method's estimate calls, if any
            if errors is None:
                raise
            errors[name] = exc
            continue
        plan[name] = n_rep
    samples: dict[str, list[float]] = {name: [] for name in plan}
    names = list(plan)
    for i in range(max(plan.values(), default=0)):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            if i < plan[name]:
                _clear(grad_to_none)
                clock.call(methods[name], samples[name])
        clock.collect()
    return {name: Timing(tuple(samples[name])) for name in names}


def median_ms(
    fn: Callable[[], object], grad_to_none: Sequence = (), warmup: int = 5, repeats: int = 20
) -> float:
    """One method's median ms (a probe's single question; benches compare methods with ``measure``)."""
    return measure({"fn": fn}, warmup=warmup, repeats=repeats, grad_to_none=grad_to_none)["fn"].median


# failures that are a result of the configuration (no peer installed, out of memory, a family we refuse), not of
# the bench: recorded in the row without a traceback
EXPECTED_FAILURES = ("ImportError", "ModuleNotFoundError", "OutOfMemoryError", "RegistryError", "PatchError")


def record_failure(out: dict, exc: BaseException) -> None:
    """The row of a run that raised: ``ok`` False and the error; a traceback printed unless the failure is one a
    configuration may legitimately end in."""
    out.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
    if type(exc).__name__ not in EXPECTED_FAILURES:
        import traceback

        traceback.print_exception(exc)


def time_steps(step: Callable[[int], object], steps: int, cuda: bool) -> tuple[list, list[float]]:
    """Run ``step(i)`` for each step, the device synchronised around each: (what each returned, seconds)."""
    sync = _cuda_sync if cuda else (lambda: None)
    values, seconds = [], []
    for i in range(steps):
        sync()
        start = time.perf_counter()
        values.append(step(i))
        sync()
        seconds.append(time.perf_counter() - start)
    return values, seconds


def steady_median(seconds: Sequence[float], warmup: int) -> float:
    """Median of the steps after the warm-up steps (all of them when there are no more)."""
    return statistics.median(list(seconds[warmup:]) or list(seconds))


def _cuda_sync() -> None:
    import torch

    torch.cuda.synchronize()


# --- memory --------------------------------------------------------------------------------------------------


def peak_mib(fn: Callable[[], object], clear: Sequence = ()) -> float | None:
    """Peak allocated during one call of fn minus what was allocated before it, MiB (None off CUDA)."""
    import torch

    if not _is_cuda():
        return None
    _clear(clear)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    _clear(clear)
    return peak / 2**20


def kernel_ms(fn, grads=(), iters: int = 5, label: str = "") -> float:
    """Sum of GPU kernel (and memcpy/memset) time per call, from the profiler: tells launch/CPU overhead apart."""
    from torch.profiler import ProfilerActivity, profile

    def step():
        _clear(grads)
        fn()

    step()
    _cuda_sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        _cuda_sync()
    if label:
        print(f"--- kernels of {label} (per {iters} steps)")
        try:
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=8))
        except Exception as e:  # noqa: BLE001 - the table is a courtesy; the total below is the result
            print("profiler table unavailable:", repr(e))
    total = sum(
        getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        for e in prof.key_averages()
    )
    return total / 1000.0 / iters


# --- environment ---------------------------------------------------------------------------------------------


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - not installed
        return None


COMMIT_VARIABLE = "BENCH_COMMIT"


def commit() -> str | None:
    """$BENCH_COMMIT when set (a copy of the checkout whose git metadata is not its own), else
    ``git describe --always --dirty``: a tree that differs from its commit says so."""
    if named := os.environ.get(COMMIT_VARIABLE):
        return named
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def device_slug(name: str | None) -> str:
    """A short device name for file names: 'NVIDIA H100 80GB HBM3' -> h100, no device -> cpu."""
    if not name or name == "cpu":
        return "cpu"
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (model.group(1) if model else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")).lower()


def capture_env(device: str | None = None) -> dict:
    """Device, versions and commit. ``device=None`` asks torch (initialises CUDA: a driver that forks its runs
    passes the name its runs reported instead)."""
    import torch

    if device is None:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {
        "device": device,
        "device_slug": device_slug(device),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "liger_kernel": _version("liger-kernel"),
        "python": sys.version.split()[0],
        "commit": commit(),
    }


# --- result files --------------------------------------------------------------------------------------------


class Results:
    """One run's result files: the JSON (``bench_<name>[-<tag>]_<device>_<date>.json``), its PNGs and the CSV
    rows."""

    def __init__(self, bench: str, out: str | Path | None = None, env: dict | None = None, tag: str = ""):
        self.bench, self.tag, self.out = bench, tag, out_dir(out)
        self._env = env
        self.date = datetime.date.today().isoformat()
        self.rows: list[tuple[str, str, str, float]] = []

    @property
    def env(self) -> dict:
        if self._env is None:
            self._env = capture_env()
        return self._env

    def set_env(self, env: dict) -> None:
        self._env = env

    def path(self, ext: str, suffix: str = "") -> Path:
        name = f"bench_{self.bench}" + (f"-{self.tag}" if self.tag else "")
        return self.out / f"{name}_{self.env['device_slug']}_{self.date}{suffix}.{ext}"

    def add(self, case: str, method: str, metric: str, value) -> None:
        """One measurement for the CSV; values that are not numbers (a failed run) are left out."""
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            return
        self.rows.append((str(case), str(method), metric, float(value)))

    def write(self, payload: dict) -> Path:
        """The JSON (payload with the environment under "env") and the measurements appended to the CSV."""
        path = self.path("json")
        path.write_text(json.dumps({"env": self.env, **payload}, indent=1, default=str))
        self._append_csv()
        return path

    def _append_csv(self) -> None:
        path = self.out / CSV_NAME
        new = not path.exists()
        env = self.env
        fixed = [self.date, env.get("commit") or "", env["device_slug"], env.get("torch") or ""]
        fixed += [env.get("triton") or "", env.get("transformers") or "", self.bench]
        with path.open("a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(CSV_COLUMNS)
            for case, method, metric, value in self.rows:
                writer.writerow([*fixed, case, method, metric, repr(value)])
        self.rows.clear()


def write_json(name: str, payload: dict, out: str | Path | None = None) -> Path:
    """A JSON named ``name`` in ``out``, else $OUT when set (the GPU runner's output folder), else the default."""
    path = out_dir(out or os.environ.get("OUT")) / name
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def write_probe(probe: str, payload: dict, tag: str = "") -> Path:
    """A probe's JSON, ``probe_<probe>[-<tag>]_<device>_<date>.json`` with the environment, in $OUT when set.
    Probes answer one question; their files are not measurements for the CSV."""
    env = capture_env()
    name = f"probe_{probe}" + (f"-{tag}" if tag else "")
    name += f"_{env['device_slug']}_{datetime.date.today().isoformat()}.json"
    return write_json(name, {"env": env, **payload})


# --- tables and plots ----------------------------------------------------------------------------------------


def cell(value, spec: str = "") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec) if spec not in ("", ">") and isinstance(value, int | float) else str(value)


def table(
    columns: Sequence[tuple[str, str]], rows: Iterable[Sequence], title: str = "", markdown: bool = False
) -> str:
    """A plain text table: ``columns`` as (header, format spec; a spec right-aligns the column, ">" alone for
    text); or a Markdown table."""
    body = [[cell(v, spec) for v, (_, spec) in zip(row, columns, strict=True)] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
        return "\n".join(([title] if title else []) + lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, (h, _) in enumerate(columns)]
    numeric = [bool(spec) for _, spec in columns]

    def line(cells):
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    lines = ([title] if title else []) + [line([h for h, _ in columns]), line(["-" * w for w in widths])]
    return "\n".join(lines + [line(r) for r in body])


def print_table(
    columns: Sequence[tuple[str, str]], rows: Iterable[Sequence], title: str = "", markdown: bool = False
) -> None:
    print("\n" + table(columns, rows, title, markdown), flush=True)


def plot(draw: Callable, path: Path) -> str:
    """Draw with matplotlib (``draw(plt)`` returns the figure) into path; without matplotlib, say so."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"plot skipped: matplotlib is not installed ({exc})")
        return f"not drawn ({exc})"
    try:
        fig = draw(plt)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 - a plotting failure must not cost the table
        return f"not drawn ({type(exc).__name__}: {exc})"
    return str(path)
