"""Proves a drafted entry: the `lint --deep` checks on a temporary registry, a short fp32 parity run, then the
perturbation check (each config value the entry reads changed: the patched model must move as the original)."""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from liger_registry.lint import lint
from liger_registry.registry.applier import patched
from liger_registry.registry.errors import RegistryError
from liger_registry.registry.loader import LoadedFamily, Registry, code_problems, load_registry
from liger_registry.registry.yaml_source import load_model
from liger_registry.scaffold.draft import entry_yaml, single_family_registry
from liger_registry.scaffold.perturb import PerturbationCheck, perturbation_check
from liger_registry.schemas import FamilyEntry

STEPS = 3
LR = 1e-2
TOLERANCE = 1e-5  # fp32: max |patched - original| / (1 + max |original|), per tensor


@dataclass
class Parity:
    """Worst relative differences over the run: per-step losses, per-step gradients, final eval logits."""

    loss: float = 0.0
    grads: float = 0.0
    logits: float = 0.0
    problems: list[str] = field(default_factory=list)
    first: tuple[float, float] | None = None  # the first step's (unpatched, patched) losses

    def failures(self) -> list[str]:
        over = [
            f"{n} differ by {v:.2g} (> {TOLERANCE:g})" for n, v in self.values().items() if not v <= TOLERANCE
        ]
        return self.problems + over

    def values(self) -> dict[str, float]:
        return {"losses": self.loss, "gradients": self.grads, "logits": self.logits}


@dataclass
class Proof:
    """The lint findings, the parity run, and (where those pass) the perturbation check."""

    findings: list[str]
    parity: Parity | None
    perturbation: PerturbationCheck | None = None

    @property
    def parity_ok(self) -> bool:
        return not self.findings and self.parity is not None and not self.parity.failures()

    @property
    def ok(self) -> bool:
        return self.parity_ok and self.perturbation is not None and self.perturbation.ok

    def perturbation_summary(self) -> str:
        return self.perturbation.summary() if self.perturbation else "not run"

    def problems(self) -> list[str]:
        problems = self.findings + (self.parity.failures() if self.parity else [])
        return problems + (self.perturbation.problems() if self.perturbation else [])


def temp_registry(entry: FamilyEntry, directory: Path) -> Registry:
    """The entry written as YAML and read back as the loader reads any family file, alone in a registry."""
    path = directory / f"{entry.family}.yaml"
    path.write_text(entry_yaml(entry), encoding="utf-8")
    loaded = LoadedFamily(load_model(path, FamilyEntry), path)
    if problems := code_problems(loaded):
        raise RegistryError(f"{path}: the drafted entry names unregistered code", problems)
    return single_family_registry(loaded.entry, load_registry(), path)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max() / (1 + want.abs().max()))


def _train(model, batches: list[dict], moe: bool, fused: bool) -> dict:
    from liger_registry.scaffold.draft import first_line

    optimiser = torch.optim.SGD(model.parameters(), lr=LR)
    extra = {"output_router_logits": True} if moe else {}
    losses, grads, problems = [], [], []
    model.train()
    for step, batch in enumerate(batches[:-1]):
        torch.manual_seed(step)
        out = model(**batch, **extra)
        if fused and out.logits is not None and not problems:
            problems.append("the patched training forward with labels returned logits (FLCE not used)")
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        try:
            logits = model(**batches[-1], **({"skip_logits": False} if fused else {})).logits
        except Exception as exc:  # noqa: BLE001 - reported as the parity problem it is
            problems.append(
                f"eval forward with skip_logits=False raised {type(exc).__name__}: {first_line(exc)}"
            )
            logits = None
    return {"losses": torch.stack(losses), "grads": grads, "logits": logits, "problems": problems}


def parity(registry: Registry, model_type: str, steps: int = STEPS) -> Parity:
    """`steps` SGD steps of the tiny model unpatched, then of a copy patched, on the same batches."""
    from liger_registry.testing import tiny_batch, tiny_model

    entry = registry.family_for(model_type).entry
    reference = tiny_model(model_type, registry=registry)
    candidate = copy.deepcopy(reference)
    batches = [tiny_batch(reference, seed=i) for i in range(steps + 1)]
    moe = entry.forward == "causal_lm_moe"
    want = _train(reference, batches, moe, fused=False)  # finished before apply: rope is patched module-wide
    with patched(candidate, registry=registry):
        got = _train(candidate, batches, moe, fused=entry.flce.enabled)
    result = Parity(problems=got["problems"])
    result.loss = _rel(got["losses"], want["losses"])
    result.first = (float(want["losses"][0]), float(got["losses"][0]))
    missing = [n for step in want["grads"] for n in step if n not in got["grads"][0]]
    if missing:
        result.problems.append(f"no gradient reached {missing[0]} in the patched model")
    result.grads = max(
        (_rel(g[n], w[n]) for g, w in zip(got["grads"], want["grads"], strict=True) for n in w if n in g),
        default=0.0,
    )
    if got["logits"] is not None and want["logits"] is not None:
        result.logits = _rel(got["logits"], want["logits"])
    return result


def prove(entry: FamilyEntry) -> Proof:
    """The `lint --deep` findings of the entry alone in a temporary registry, then (if clean) its parity, then
    (if that passes) the perturbation check."""
    from liger_registry.scaffold.draft import first_line

    base = load_registry()
    with tempfile.TemporaryDirectory(prefix="liger-scaffold-") as directory:
        try:
            registry = temp_registry(entry, Path(directory))
        except RegistryError as exc:
            return Proof([str(exc), *(exc.problems or [])], None)
        try:
            findings = [f.message for f in lint(deep=True, registry=registry) if f.severity == "error"]
        except Exception as exc:  # noqa: BLE001 - the lint itself failing on the entry is a finding too
            findings = [f"lint --deep raised {type(exc).__name__}: {first_line(exc)}"]
        if findings:
            return Proof(findings, None)
        try:
            proof = Proof([], parity(registry, entry.model_types[0]))
        except Exception as exc:  # noqa: BLE001 - a crash of the patched model is what the proof found
            return Proof([f"the parity run raised {type(exc).__name__}: {first_line(exc)}"], None)
        if proof.parity_ok:
            try:
                loaded = registry.family_for(entry.model_types[0]).entry
                proof.perturbation = perturbation_check(loaded, base, proof.parity.first)
            except Exception as exc:  # noqa: BLE001 - the check failing to run proves nothing: reported
                proof.perturbation = PerturbationCheck(unpinned={"(the check)": f"raised {first_line(exc)}"})
        return proof
