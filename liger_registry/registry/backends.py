"""Which backend (Triton or PyTorch) each kernel of a resolved family uses for a device and dtype, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from liger_registry.schemas import KINDS, FamilyEntry
from liger_registry.schemas.kernel_kinds import CE_KEY, FLCE_KEY


@dataclass(frozen=True)
class BackendChoice:
    """The decision for one installed kernel."""

    kernel: str
    op: str
    backend: str
    reasons: tuple[str, ...]

    def why(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "-"


def kernel_ops(entry: FamilyEntry) -> dict[str, str]:
    """Installed kernel -> kernel op name: each enabled kind, the forward's FLCE when it fuses, and its cross
    entropy of the materialised logits when that is on."""
    ops = {
        name: kind.op_for(spec)
        for name, kind in KINDS.items()
        if (spec := getattr(entry.kernels, name)) and spec.enabled
    }
    if entry.head is not None and entry.flce.enabled:
        ops["forward"] = FLCE_KEY
    if entry.head is not None and entry.cross_entropy.enabled:
        ops[CE_KEY] = CE_KEY
    return ops


def decide_backends(entry: FamilyEntry, device: Any, dtype: Any) -> list[BackendChoice]:
    """`kernels.decide_backend(op, device, dtype)` for every kernel the family installs."""
    from liger_registry import kernels

    choices = []
    for kernel, op in kernel_ops(entry).items():
        backend, reasons = kernels.decide_backend(op, device, dtype)
        choices.append(BackendChoice(kernel, op, backend, tuple(reasons)))
    return choices
