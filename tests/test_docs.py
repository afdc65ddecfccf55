"""Every ```python block of docs/*.md runs on its own, as the docs promise, in a process of its own.

A block is found wherever it is (a block added to any docs/*.md later is picked up), and run as a script (forked
from an interpreter that has imported torch, transformers and the package: tests/snippet_server.py) in
an empty directory with this checkout first on the path and the Hugging Face hub offline. The HTML comment on
the line before a block may say how to run it:

- `<!-- skip-test: reason -->`: not run here (it needs a GPU or the network); the reason is the skip message.
- `<!-- test-nproc: N -->`: run under `torch.distributed.run --standalone --nproc_per_node N` (CPU, gloo).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
DIRECTIVE = re.compile(r"^<!--\s*(skip-test|test-nproc):\s*(.*?)\s*-->$")
TIMEOUT_S = 600
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
}


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None = None
    nproc: int | None = None

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def snippets(path: Path) -> list[Snippet]:
    """The ```python blocks of a Markdown file, each with the directive of the comment just before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        directives = {}
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        if match := DIRECTIVE.match(before):
            directives[match.group(1)] = match.group(2)
        nproc = directives.get("test-nproc")
        found.append(
            Snippet(
                path,
                start + 1,
                "\n".join(lines[start + 1 : i]) + "\n",
                directives.get("skip-test"),
                int(nproc) if nproc else None,
            )
        )
        i += 1
    return found


SNIPPETS = [s for path in DOCS for s in snippets(path)]


def test_the_docs_have_snippets():
    assert len(SNIPPETS) >= 10 and all(s.code.strip() for s in SNIPPETS)


def test_a_directive_applies_to_the_next_block_only(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text(
        "text\n<!-- skip-test: needs a GPU -->\n\n```python\nimport torch\n```\n\n```python\nx = 1\n```\n"
        "<!-- test-nproc: 2 -->\n```python\ny = 2\n```\n```bash\nls\n```\n"
    )
    found = snippets(doc)
    assert [(s.line, s.code, s.skip, s.nproc) for s in found] == [
        (4, "import torch\n", "needs a GPU", None),
        (8, "x = 1\n", None, None),
        (12, "y = 2\n", None, 2),
    ]


def _snippet_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **OFFLINE, "PYTHONPATH": path}
    env.pop("TRITON_INTERPRET", None)  # as a user runs it: CPU tensors take the PyTorch path
    return env


@pytest.fixture(scope="module")
def forked():
    """A snippet server (tests/snippet_server.py): each snippet runs in a process forked after the heavy imports."""
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("snippet_server.py"))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_snippet_env(),
        text=True,
    )

    def run(script: Path) -> tuple[int, str, str]:
        job = {"script": str(script), "cwd": str(script.parent), "timeout": TIMEOUT_S}
        server.stdin.write(json.dumps(job) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        if not reply:
            raise RuntimeError(f"the snippet server died (rc {server.poll()})")
        out = [(script.parent / name).read_text(errors="replace") for name in ("stdout.txt", "stderr.txt")]
        return json.loads(reply)["rc"], *out

    yield run
    server.stdin.close()
    server.wait(timeout=60)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs_on_its_own(snippet: Snippet, tmp_path, forked):
    if snippet.skip:
        pytest.skip(f"{snippet.id}: {snippet.skip}")
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, encoding="utf-8")
    if snippet.nproc:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        done = subprocess.run(
            [*launcher, f"--nproc_per_node={snippet.nproc}", str(script)],
            cwd=tmp_path,
            env=_snippet_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    else:
        rc, stdout, stderr = forked(script)
    assert rc == 0, f"{snippet.id} failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"


def test_a_failing_snippet_fails(tmp_path, forked):
    script = tmp_path / "snippet.py"
    script.write_text("import sys\nprint('out')\nraise ValueError('the snippet broke')\n", encoding="utf-8")
    rc, stdout, stderr = forked(script)
    assert (rc, stdout) == (1, "out\n") and "ValueError: the snippet broke" in stderr
    script.write_text("print(torch)\n", encoding="utf-8")  # the server's imports are not the snippet's
    assert forked(script)[0] == 1


def _read_variables(source: str) -> set[str]:
    """Names of the environment variables a module reads: `os.environ[X]`, `os.environ.get(X)`,
    `os.getenv(X)`, with X a string or a module-level string constant."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    keys = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            keys.append(node.slice)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr == "get" and is_environ(func.value)) or func.attr == "getenv":
                keys.append(node.args[0])
    names = set()
    for key in keys:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        elif isinstance(key, ast.Name) and key.id in constants:
            names.add(constants[key.id])
        else:
            raise AssertionError(
                f"an environment variable read through {ast.unparse(key)}: name it in a constant"
            )
    return names


def test_every_environment_variable_the_package_reads_is_documented_and_reported():
    from liger_registry.environment import VARIABLES

    # environment.py only reports the variables (a loop over VARIABLES); it must report exactly these.
    sources = [p for p in sorted((ROOT / "liger_registry").rglob("*.py")) if p.name != "environment.py"]
    read = set().union(*(_read_variables(p.read_text(encoding="utf-8")) for p in sources))
    expected = {"LIGER_REGISTRY_BACKEND", "LIGER_REGISTRY_PATH", "TRITON_INTERPRET"}
    assert expected <= read  # the walk finds them
    assert set(VARIABLES) == read
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Environment variables") :]
    assert sorted(v for v in read if f"| `{v}` |" not in section) == []


def test_variable_reads_are_found_through_constants():
    source = (
        'import os\nVAR = "A_B"\nx = os.environ.get(VAR, "")\ny = os.environ["C_D"]\nz = os.getenv("E")\n'
    )
    assert _read_variables(source) == {"A_B", "C_D", "E"}
