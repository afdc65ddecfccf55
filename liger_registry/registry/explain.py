"""The resolved configuration of a model or model type, with provenance, without patching anything."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liger_registry.registry.configure import configure
from liger_registry.registry.loader import Registry
from liger_registry.registry.report import config_table
from liger_registry.registry.resolve import ResolvedConfig


@dataclass
class Explanation:
    config: ResolvedConfig

    def __str__(self) -> str:
        entry = self.config.entry
        forward = "none (no causal-LM head)" if entry.head is None else entry.forward
        lines = [f"family {entry.family} ({self.config.path.name}); forward {forward}"]
        if self.config.policies:
            lines.append(f"policies: {', '.join(self.config.policies)}")
        lines.append(config_table(self.config))
        reasons = [(k, s.reason) for k, s in entry.kernels if s is not None and s.reason]
        reasons += [("flce", entry.flce.reason)] if entry.flce.reason else []
        reasons += [("family", entry.reason)] if entry.reason else []
        lines += [f"reason ({k}): {r}" for k, r in reasons]
        lines += [f"known broken: transformers {v}: {why}" for v, why in entry.known_broken.items()]
        return "\n".join(lines)

    def value(self, knob: str) -> Any:
        return self.config.values[knob]

    def source(self, knob: str):
        return self.config.source(knob)


def explain(
    model_or_model_type: Any,
    policy: str | Path | list | None = None,
    *,
    registry: Registry | None = None,
    **overrides: Any,
) -> Explanation:
    """What apply() would install, each knob with the layer that set it; imports no torch and patches nothing."""
    return Explanation(configure(model_or_model_type, policy, registry, **overrides))
