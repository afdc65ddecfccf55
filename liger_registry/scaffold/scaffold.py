"""Scaffolds one model type: draft its entry, prove it, and turn off a kernel the proof convicts; an entry whose
parity passes but whose perturbation check cannot pin an attribute down is kept, marked not proven."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import transformers
from packaging.version import Version

from liger_registry.scaffold.draft import Refused, draft, entry_yaml
from liger_registry.scaffold.prove import Proof, prove
from liger_registry.schemas import FamilyEntry

# Tried in this order when the drafted entry fails its proof: the kernel whose decision is least direct first.
ABLATION_ORDER = ("rope", "swiglu", "geglu", "rms_norm", "layer_norm")


@dataclass
class ScaffoldResult:
    model_type: str
    entry: FamilyEntry | None = None  # the draft (proven or not); None when refused
    reasons: list[str] = field(default_factory=list)  # why it was refused, or why the draft is not proven
    corrections: list[str] = field(default_factory=list)  # kernels the proof turned off
    proof: Proof | None = None
    seconds: float = 0.0
    refusal: Refused | None = None  # what refused it

    @property
    def ok(self) -> bool:
        """Drafted and proven: lint, parity and the perturbation check all passed."""
        return self.entry is not None and self.proof is not None and self.proof.ok

    @property
    def unproven(self) -> bool:
        """Drafted, its parity passed, but an attribute it reads is not pinned down: not claimed proven."""
        return self.entry is not None and not self.ok

    @property
    def status(self) -> str:
        return "proven" if self.ok else "not proven" if self.unproven else "refused"

    def yaml(self) -> str:
        return entry_yaml(self.entry) if self.entry is not None else ""


def _tested(entry: FamilyEntry) -> FamilyEntry:
    """The entry with the installed transformers (major.minor) as the version its proof ran on."""
    version = Version(transformers.__version__)
    return entry.model_copy(update={"tested": [f"{version.major}.{version.minor}"]})


def _without(entry: FamilyEntry, kernel: str, why: str) -> FamilyEntry:
    spec = getattr(entry.kernels, kernel).model_copy(update={"enabled": False, "reason": why})
    return entry.model_copy(update={"kernels": entry.kernels.model_copy(update={kernel: spec})})


def _ablate(entry: FamilyEntry, proof: Proof, result: ScaffoldResult) -> FamilyEntry | None:
    """The entry with the one kernel turned off whose absence makes the proof pass, or None."""
    for kernel in ABLATION_ORDER:
        spec = getattr(entry.kernels, kernel)
        if spec is None or not spec.enabled:
            continue
        why = f"the scaffold's proof failed with it on ({'; '.join(proof.problems())[:300]})"
        candidate = _without(entry, kernel, why)
        if (second := prove(candidate)).parity_ok:
            result.corrections.append(f"{kernel} off: {why}")
            result.proof = second
            return candidate
    return None


def scaffold(
    model_type: str, family: str | None = None, settings: dict[str, Any] | None = None
) -> ScaffoldResult:
    """Draft and prove the entry of `model_type`. Refused: `result.entry` is None, `result.reasons` say why.
    Not proven (parity passes, the perturbation check does not): the entry, and `reasons` naming each attribute
    not pinned down. `settings`: config values over the scaffold's (fields the default config leaves unset)."""
    start = time.perf_counter()
    result = ScaffoldResult(model_type)
    try:
        entry = draft(model_type, family, settings).entry
    except Refused as exc:
        result.refusal = exc
        result.reasons.append(str(exc))
        result.seconds = time.perf_counter() - start
        return result
    result.proof = prove(entry)
    if result.proof.ok:
        result.entry = _tested(entry)
    elif result.proof.parity_ok:
        result.entry = entry  # the tested versions are those of a proof; this one is not proven
        result.reasons += result.proof.problems()
    elif (fixed := _ablate(entry, result.proof, result)) is not None:
        result.entry = _tested(fixed) if result.proof.ok else fixed
        result.reasons += [] if result.proof.ok else result.proof.problems()
    else:
        result.refusal = Refused("; ".join(result.proof.problems()))
        result.reasons += [f"proof failed: {p}" for p in result.proof.problems()]
    result.seconds = time.perf_counter() - start
    return result
