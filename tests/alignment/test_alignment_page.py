"""docs/alignment.md shows every loss and the TRL trainer (tests/test_docs.py runs every snippet of docs/)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "alignment.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_a_snippet_per_loss_and_one_for_trl():
    text = "\n".join(SNIPPETS)
    for name in ("dpo_loss", "orpo_loss", "simpo_loss", "kto_loss", "grpo_loss", "distillation_loss"):
        assert f"{name}(" in text
    assert "FusedDPOTrainer(" in text
    assert "add_fused_lm_head(" in text and "use_for_trl_fused_head()" in text
