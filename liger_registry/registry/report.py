"""What an apply replaced, where, with what, and which layer set each knob; printable as a table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from liger_registry.registry.resolve import BUDGET, ResolvedConfig, not_applied_line


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
        if value is not None or knob in BUDGET  # a cleared budget knob is shown with who cleared it
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
    backends: list[Any] = field(
        default_factory=list
    )  # BackendChoice per kernel, for the model's device/dtype
    backends_for: str = ""  # "cuda:0 / bfloat16"; empty for a class-wide patch (decided per call)

    def loss_line(self) -> str:
        """How the installed forward computes the training loss, and the loss of materialised logits."""
        entry = self.config.entry
        logits_loss = (
            "the cross_entropy kernel"
            if entry.cross_entropy.enabled
            else "transformers' loss (cross_entropy off)"
        )
        return f"{self._training_loss(entry.flce)}; loss of materialised logits: {logits_loss}"

    def _training_loss(self, flce) -> str:
        if flce.enabled:
            budget = (
                f"max_chunk_mib={flce.max_chunk_mib}"
                if flce.max_chunk_mib is not None
                else f"chunk_mem_const={flce.chunk_mem_const}"
            )
            options = [
                f"{name}={getattr(flce, name)}"
                for name in ("lse_square_scale", "label_smoothing", "accum_dtype", "use_token_scaling")
                if getattr(flce, name) not in (None, False, 0, 0.0)
            ]
            return (
                f"training loss: fused_linear_cross_entropy ({', '.join([budget, f'strategy={flce.strategy}', *options])}), "
                "no logits"
            )
        return "training loss: from materialised logits (fused_linear_cross_entropy off); skip_logits still honoured"

    def backend(self, kernel: str) -> str:
        choice = next((c for c in self.backends if c.kernel == kernel), None)
        return "per call" if choice is None else choice.backend

    def counts(self) -> dict[str, int]:
        return dict(Counter(r.kernel for r in self.patched))

    def __str__(self) -> str:
        grouped = Counter((r.kernel, r.scope, r.original, r.replacement) for r in self.patched)
        rows = [[k, s, str(n), self.backend(k), o, r] for (k, s, o, r), n in grouped.items()]
        rows += [[k, "skipped", "0", "-", reason, ""] for k, reason in self.skipped.items()]
        text = f"liger_registry: family {self.family} ({self.scope})\n"
        if self.config.policies:
            text += f"policies: {', '.join(self.config.policies)}\n"
        if left_out := not_applied_line(self.config):
            text += left_out + "\n"
        text += table(["kernel", "scope", "count", "backend", "replaced", "with"], rows)
        if any(r.kernel == "forward" for r in self.patched):
            text += "\n" + self.loss_line()
        if self.backends:
            why = [f"  {c.kernel} ({c.op}): {c.why()}" for c in self.backends if c.reasons]
            text += f"\nbackends on {self.backends_for}" + (
                ": why not triton:\n" + "\n".join(why) if why else ": all triton"
            )
        if self.warnings:
            text += "\nwarnings:\n" + "\n".join(f"  - {w}" for w in self.warnings)
        return text
