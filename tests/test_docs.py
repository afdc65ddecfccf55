"""Every ```python block of docs/*.md runs on its own, as the docs promise, in a fresh interpreter.

A block is found wherever it is (a block added to any docs/*.md later is picked up), and run as a script in
an empty directory with this checkout first on the path and the Hugging Face hub offline. The HTML comment on
the line before a block may say how to run it:

- `<!-- skip-test: reason -->`: not run here (it needs a GPU or the network); the reason is the skip message.
- `<!-- test-nproc: N -->`: run under `torch.distributed.run --standalone --nproc_per_node N` (CPU, gloo).
"""

from __future__ import annotations

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
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled"}


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


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs_on_its_own(snippet: Snippet, tmp_path):
    if snippet.skip:
        pytest.skip(f"{snippet.id}: {snippet.skip}")
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, encoding="utf-8")
    launcher = [sys.executable]
    if snippet.nproc:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={snippet.nproc}"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **OFFLINE, "PYTHONPATH": path}
    env.pop("TRITON_INTERPRET", None)  # as a user runs it: CPU tensors take the PyTorch path
    done = subprocess.run(
        [*launcher, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, f"{snippet.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
