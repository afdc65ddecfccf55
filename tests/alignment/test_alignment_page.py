"""docs/alignment.md shows every loss and the TRL trainer (tests/test_docs.py runs every snippet of docs/); the
README's RL head section opens with a snippet that runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "alignment.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_a_snippet_per_loss_and_one_for_trl():
    text = "\n".join(SNIPPETS)
    for name in ("dpo_loss", "orpo_loss", "simpo_loss", "kto_loss", "grpo_loss", "distillation_loss"):
        assert f"{name}(" in text
    assert "FusedDPOTrainer(" in text
    assert "add_fused_lm_head(" in text and "use_for_trl_fused_head()" in text


def test_the_readme_rl_head_section_opens_with_a_snippet_that_runs(run_readme_snippet):
    run_readme_snippet("TRL's fused RL head (GRPOTrainer)")
