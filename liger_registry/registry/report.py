"""What an apply replaced, where, with what, and which layer set each knob; printable as a table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from liger_registry.registry.resolve import ResolvedConfig


def _name(obj: object) -> str:
    target = getattr(obj, "__func__", obj)
    target = getattr(target, "__liger_forward__", target)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"


@dataclass(frozen=True)
class Replacement:
    """One attribute that was replaced."""

    kernel: str
    scope: str
    target: str
    attribute: str
    original: str
    replacement: str


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]

    def line(cells) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line("-" * w for w in widths), *(line(r) for r in rows)])


def config_table(config: ResolvedConfig) -> str:
    rows = [
        [knob, repr(value), str(config.source(knob))]
        for knob, value in config.values.items()
        if value is not None
    ]
    return table(["knob", "value", "set by"], rows)


@dataclass
class PatchReport:
    family: str
    scope: str
    config: ResolvedConfig
    patched: list[Replacement] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def loss_line(self) -> str:
        """How the installed forward computes the training loss."""
        flce = self.config.entry.flce
        if flce.enabled:
            return f"training loss: fused_linear_cross_entropy (chunk_mem_const={flce.chunk_mem_const}), no logits"
        return "training loss: from materialised logits (fused_linear_cross_entropy off); skip_logits still honoured"

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.kernel for r in self.patched))

    def __str__(self) -> str:
        grouped = Counter((r.kernel, r.scope, r.original, r.replacement) for r in self.patched)
        rows = [[k, s, str(n), o, r] for (k, s, o, r), n in grouped.items()]
        rows += [[k, "skipped", "0", reason, ""] for k, reason in self.skipped.items()]
        text = f"liger_registry: family {self.family} ({self.scope})\n"
        text += table(["kernel", "scope", "count", "replaced", "with"], rows)
        if any(r.kernel == "forward" for r in self.patched):
            text += "\n" + self.loss_line()
        if self.warnings:
            text += "\nwarnings:\n" + "\n".join(f"  - {w}" for w in self.warnings)
        return text
