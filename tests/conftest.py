"""Test configuration: on a machine without CUDA, Triton's interpreter must be on before triton is imported
(CPU runs of the kernels). With a GPU the kernels compile for it (the tests marked gpu)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # The CPU tests' tensors are tiny: a second intra-op thread only adds synchronisation, which costs many
    # times the arithmetic when pytest-xdist's workers share the cores. Subprocesses (the CLI, torchrun) inherit
    # the setting.
    torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))
    # Inductor's pool of compile workers (processes that import torch) costs more than the few graphs a CPU
    # test compiles; read when torch._inductor.config is first imported.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def _fresh(value):
    """A copy of parsed YAML data (dicts, lists and scalars), so no caller shares a container with the cache."""
    if isinstance(value, dict):
        return {key: _fresh(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_fresh(item) for item in value]
    return value


def _memoise_yaml_parsing() -> None:
    """Every apply() and tiny_model() loads the registry, parsing each bundled YAML file with PyYAML's pure-Python
    composer (most of a load's time). The composition is a function of the file's path, its text and the size
    limits, so the suite composes each distinct text once; errors are never cached, and the loader still reads
    every file, validates every entry and checks every plugin and path on every load."""
    from liger_registry.registry import yaml_source

    compose, cache = yaml_source._compose, {}

    def memoised(path, text):
        key = (str(path), text, yaml_source.MAX_NODES, yaml_source.MAX_DEPTH)
        if key not in cache:
            cache[key] = compose(path, text)
        data, node, shape = cache[key]
        return _fresh(data), node, list(shape)

    yaml_source._compose = memoised


_memoise_yaml_parsing()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test skipped for want of CUDA runs only where the GPU runner selects it (``-m gpu``): one without the
    marker would be skipped here and deselected there, never run."""
    unmarked = [
        item.nodeid
        for item in items
        if item.get_closest_marker("gpu") is None
        and any("CUDA" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))
    ]
    if unmarked:
        raise pytest.UsageError("skipped without CUDA but not marked gpu: " + ", ".join(unmarked))


@pytest.fixture(params=["torch", "triton"])
def glu_backend(request, monkeypatch):
    """The GLU tests' backend: PyTorch, or Triton (through the interpreter on CPU) with the elementwise kernels'
    block lowered to the test module's ``GLU_BLOCK`` (default 16), so small tensors span several blocks."""
    from liger_registry import kernels as K
    from liger_registry.kernels import triton_utils

    if request.param == "triton":
        if not triton_utils.INTERPRET_AT_IMPORT:
            pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
        from liger_registry.kernels.glu import triton_kernels

        monkeypatch.setattr(triton_kernels, "BLOCK", getattr(request.module, "GLU_BLOCK", 16))
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


# End-of-run tables (tests/convergence: parity rows; tests/reliability: cases per category). A test's report
# carries what it adds as a user property, and the tables are printed from the reports, so they are whole also
# when pytest-xdist runs the tests in workers (whose own terminal summaries are not shown).
SUMMARY_LINES = "summary_lines"  # (title lines, lines): appended under the title
SUMMARY_COUNTS = "summary_counts"  # (title lines, {row: [counts]}): summed per row
_LINES: dict[tuple[str, ...], list[str]] = {}
_COUNTS: dict[tuple[str, ...], dict[str, list[int]]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == SUMMARY_LINES:
            title, lines = value
            _LINES.setdefault(tuple(title), []).extend(lines)
        elif name == SUMMARY_COUNTS:
            title, rows = value
            table = _COUNTS.setdefault(tuple(title), {})
            for row, counts in rows.items():
                table[row] = [a + b for a, b in zip(table.get(row, [0] * len(counts)), counts, strict=True)]


def pytest_terminal_summary(terminalreporter) -> None:
    write = terminalreporter.write_line
    for title, lines in _LINES.items():
        for line in ("", *title, *lines):
            write(line)
    for title, table in _COUNTS.items():
        for line in ("", *title):
            write(line)
        for row, counts in table.items():
            write(row.format(*counts))


@pytest.fixture
def run_readme_snippet(tmp_path):
    """Runs the ```python block that opens a README section as a user would (as tests/test_docs.py runs the docs'
    snippets): on its own, in a fresh interpreter, offline, this checkout first on the path, CPU tensors on the
    PyTorch path. ``run(title)`` asserts it exits 0 and returns its code and stdout."""
    root = Path(__file__).resolve().parents[1]

    def run(title: str) -> tuple[str, str]:
        readme = (root / "README.md").read_text(encoding="utf-8")
        body = readme[readme.index(f"## {title}\n") :].split("\n", 1)[1].lstrip("\n")
        assert body.startswith("```python\n"), "the section opens with the snippet"
        code = body.removeprefix("```python\n").split("\n```")[0]
        script = tmp_path / "snippet.py"
        script.write_text(code, encoding="utf-8")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(root)}
        env.pop("TRITON_INTERPRET", None)
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return code, done.stdout

    return run
