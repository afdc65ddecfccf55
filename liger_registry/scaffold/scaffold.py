"""Scaffolds one model type: draft its entry, prove it, and turn off a kernel the proof convicts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
    entry: FamilyEntry | None = None
    reasons: list[str] = field(default_factory=list)  # why it was refused
    corrections: list[str] = field(default_factory=list)  # kernels the proof turned off
    proof: Proof | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.entry is not None

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
        if (second := prove(candidate)).ok:
            result.corrections.append(f"{kernel} off: {why}")
            result.proof = second
            return candidate
    return None


def scaffold(model_type: str, family: str | None = None) -> ScaffoldResult:
    """Draft and prove the entry of `model_type`; `result.entry` is None and `result.reasons` say why when refused."""
    start = time.perf_counter()
    result = ScaffoldResult(model_type)
    try:
        entry = draft(model_type, family).entry
    except Refused as exc:
        result.reasons.append(str(exc))
        result.seconds = time.perf_counter() - start
        return result
    result.proof = prove(entry)
    if result.proof.ok:
        result.entry = _tested(entry)
    elif (fixed := _ablate(entry, result.proof, result)) is not None:
        result.entry = _tested(fixed)
    else:
        result.reasons += [f"proof failed: {p}" for p in result.proof.problems()]
    result.seconds = time.perf_counter() - start
    return result
