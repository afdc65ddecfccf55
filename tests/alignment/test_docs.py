"""Every python snippet of docs/alignment.md runs as is (in a scratch directory)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "alignment.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_a_snippet_per_loss_and_one_for_trl():
    text = "\n".join(SNIPPETS)
    for name in ("dpo_loss", "orpo_loss", "simpo_loss", "kto_loss", "grpo_loss", "distillation_loss"):
        assert f"{name}(" in text
    assert "FusedDPOTrainer(" in text


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(SNIPPETS[index])
    runpy.run_path(str(script), run_name="__main__")
