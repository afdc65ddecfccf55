"""Proves that every forward honours skip_logits, every YAML file validates and every target resolves."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from liger_registry.forwards import get_forward, registered_forwards
from liger_registry.lint import parity
from liger_registry.lint.where import problem_location, source_location, yaml_line
from liger_registry.registry.applier import apply
from liger_registry.registry.errors import PatchError, RegistryError, UnsupportedModelError
from liger_registry.registry.loader import LoadedFamily, Registry, load_registry
from liger_registry.registry.plan import never_fuses
from liger_registry.registry.targets import (
    head_problems,
    moe_problems,
    resolve_class,
    target_problems,
    transformers_version,
    version_problem,
)
from liger_registry.schemas.kernel_kinds import FLCE_KEY

P = inspect.Parameter


@dataclass(frozen=True)
class Finding:
    """One problem the lint found."""

    check: str
    where: str
    message: str
    severity: str = "error"  # error | note (what was proved, or why a proof could not run; exit code 0)
    file: str | None = None  # the file to fix: the family's YAML, or the forward's source
    line: int | None = None  # 1-based line in `file`, where known

    def __str__(self) -> str:
        tag = self.check if self.severity == "error" else f"{self.check} note"
        return f"{self.where}: [{tag}] {self.message}"

    def as_dict(self) -> dict[str, str | int | None]:
        return asdict(self)


def _in_yaml(findings: list[Finding], path: Path) -> list[Finding]:
    """Findings without a location get the family file and the line they are about."""
    return [
        f if f.file is not None else replace(f, file=str(path), line=yaml_line(path, f.check, f.message))
        for f in findings
    ]


def _name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _accepts(params: dict[str, P], original: P) -> bool:
    if original.name in params and params[original.name].kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
        return True
    kinds = {p.kind for p in params.values()}
    if original.kind is P.POSITIONAL_OR_KEYWORD:
        return P.VAR_POSITIONAL in kinds and P.VAR_KEYWORD in kinds
    if original.kind is P.POSITIONAL_ONLY or original.kind is P.VAR_POSITIONAL:
        return P.VAR_POSITIONAL in kinds
    return P.VAR_KEYWORD in kinds


def lint_forward(fn: Callable, original: Callable | None = None) -> list[Finding]:
    """Findings for one forward: skip_logits must be a named parameter; every parameter of `original`
    must be accepted (by name, or by *args and **kwargs that the forward binds against the original)."""
    where = _name(fn)
    params = dict(inspect.signature(fn).parameters)
    file, line = source_location(fn)
    findings = []
    skip = params.get("skip_logits")
    if skip is None or skip.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
        findings.append(
            Finding(
                "skip-logits", where, "skip_logits is not a named parameter (only **kwargs would take it)"
            )
        )
    elif skip.default is not None:
        findings.append(
            Finding("skip-logits", where, f"skip_logits must default to None, not {skip.default!r}")
        )
    if original is not None:
        for param in list(inspect.signature(original).parameters.values())[1:]:
            if not _accepts(params, param):
                findings.append(
                    Finding("signature", where, f"does not accept {param.name!r} of {_name(original)}")
                )
    return [replace(f, file=file, line=line) for f in findings]


def _family_findings(loaded: LoadedFamily) -> list[Finding]:
    entry, where = loaded.entry, str(loaded.path)
    if problem := version_problem(entry):
        # A family declared for other releases (InternLM3: a type only 5.24 registers) does not apply here: what
        # it names need not exist, so nothing else of it is checked; not an error of the registry.
        return [Finding("version", where, f"{problem}: its checks do not run here", "note")]
    findings = [Finding("targets", where, p) for p in target_problems(entry)]
    try:
        spec = get_forward(entry.forward)
    except KeyError as exc:
        return [*findings, Finding("forward", where, str(exc.args[0]))]
    if entry.head is not None and entry.flce.enabled and not spec.fuses:
        findings.append(Finding("forward", where, never_fuses(entry.forward)))
    if entry.head is not None and spec.moe:
        findings += [Finding("moe", where, p) for p in moe_problems(entry)]
    if spec.fuses:  # the forwards that read the head's attributes
        findings += [Finding("head", where, p) for p in head_problems(entry)]
    if not findings and entry.head is not None:
        original = resolve_class(entry, entry.causal_lm).forward
        findings += lint_forward(spec.fn, original)
    return findings


def lint(
    deep: bool = False, registry_dirs: tuple = (), registry: Registry | None = None, families: tuple = ()
) -> list[Finding]:
    """All findings over the registry (only `families`, when named; an unknown name raises
    UnsupportedModelError); `deep` also runs each family's tiny model (skip_logits and parity)."""
    findings = [f for spec in registered_forwards().values() for f in lint_forward(spec.fn)]
    try:
        registry = registry or load_registry(*registry_dirs)
    except RegistryError as exc:
        return findings + [
            Finding("yaml", "registry", p, "error", *problem_location(p)) for p in exc.problems or [str(exc)]
        ]
    findings += [Finding("yaml", "registry", p, "error", *problem_location(p)) for p in registry.skipped]
    selected = [registry.family(name) for name in families] or list(registry.families.values())
    for loaded in selected:
        family_findings = _in_yaml(_family_findings(loaded), loaded.path)
        findings += family_findings
        if deep and not [f for f in family_findings if f.severity == "error" or f.check == "version"]:
            findings += _in_yaml(deep_check(loaded, registry), loaded.path)
    return findings


def _loss_close(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)


def deep_check(loaded: LoadedFamily, registry: Registry) -> list[Finding]:
    """Build the family's tiny model and check the four skip_logits behaviours of its forward at run time.

    A family without a causal-LM head (`head: null`) is proved to have none instead; a family whose original
    forward is declared broken on the installed transformers (`known_broken`) gets a note saying so.
    """
    from liger_registry.testing import tiny_batch, tiny_model

    entry, where = loaded.entry, f"{loaded.path} (deep)"
    note_at = f"{entry.family} (deep)"
    try:
        model = tiny_model(entry.model_types[0], registry=registry)
    except (ValueError, KeyError, UnsupportedModelError, RuntimeError, TypeError) as exc:
        return [Finding("deep", where, f"cannot build a tiny model: {exc}")]
    if entry.head is None:
        return _no_head_findings(model, entry, where, registry, note_at)
    if broken := entry.broken_on(transformers_version()):
        apply(model, registry=registry).revert()
        return [Finding("deep", note_at, f"skip_logits proof not run: {broken}", "note")]
    batch = tiny_batch(model)
    with torch.no_grad():
        reference = model(**batch).loss
    unpatched = parity.run(model, batch, has_head=True)  # before any apply: RoPE is patched module-wide
    # As configured, and with FLCE off ("never fuse"): the forward owns skip_logits either way.
    variants = {"FLCE on": {}, "FLCE off": {FLCE_KEY: False}} if entry.flce.enabled else {"FLCE off": {}}
    findings = []
    for label, overrides in variants.items():
        try:
            handle = apply(model, registry=registry, **overrides)
        except PatchError as exc:  # the entry does not fit its own tiny model: a finding, not a crash
            findings.append(Finding("deep", where, f"{label}: apply refused the tiny model: {exc}"))
            continue
        try:
            fuses = handle.report.config.entry.flce.enabled
            problems = _skip_logits_problems(model, batch, reference, entry.skip_logits, fuses)
            patched_run = parity.run(model, batch, has_head=True, skip_logits=False)
            problems += parity.differences(patched_run, unpatched, has_head=True)
        except Exception as exc:  # a forward that crashes is a finding of its family, not the end of the lint
            problems = [f"the patched forward raised {type(exc).__name__}: {exc}"]
        finally:
            handle.revert()
        findings += [Finding("deep", where, f"{label}: {m}") for m in problems]
    if findings:
        return findings
    proved = " and ".join(variants)
    return [
        Finding(
            "deep",
            note_at,
            f"skip_logits None/True/False/True-without-labels, and logits, gradients and loss equal to the "
            f"unpatched model's (fp32), proved ({proved})",
            "note",
        )
    ]


def _no_head_findings(model, entry, where: str, registry: Registry, note_at: str) -> list[Finding]:
    """`head: null` must be true: no lm_head, no labels parameter, no logits in the output."""
    from liger_registry.testing import tiny_batch

    problems = []
    if isinstance(getattr(model, "lm_head", None), torch.nn.Module):
        problems.append(f"head: null, but {type(model).__name__} has an lm_head")
    if "labels" in inspect.signature(type(model).forward).parameters:
        problems.append(f"head: null, but {type(model).__name__}.forward takes labels")
    batch = tiny_batch(model)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        if "logits" in model(**inputs):
            problems.append(f"head: null, but {type(model).__name__} returns logits")
    if problems:
        return [Finding("deep", where, p) for p in problems]
    unpatched = parity.run(model, batch, has_head=False)
    handle = apply(model, registry=registry)
    try:
        problems = parity.differences(parity.run(model, batch, has_head=False), unpatched, False)
    except Exception as exc:  # a crashing kernel is a finding of its family
        problems = [f"the patched model raised {type(exc).__name__}: {exc}"]
    finally:
        handle.revert()
    if problems:
        return [Finding("deep", where, p) for p in problems]
    return [
        Finding(
            "deep",
            note_at,
            f"no causal-LM head: {type(model).__name__} has no lm_head, takes no labels and returns no logits "
            "(proved); kernels only, no forward; hidden states and gradients equal to the unpatched model's",
            "note",
        )
    ]


def _skip_logits_problems(model, batch, reference, mode: str, fuses: bool) -> list[str]:
    """The documented skip_logits behaviours; `fuses`: the loss is fused (FLCE on), so `auto` skips in training.
    A forward that does not fuse returns the logits it computed unless the mode is `labels`."""
    problems = []
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        model.train()
        default = model(**batch)
        if (default.logits is None) != (mode == "labels" or (mode == "auto" and fuses)):
            problems.append(
                f"training with labels and skip_logits=None (mode {mode}): logits {'missing' if default.logits is None else 'returned'}"
            )
        kept = model(**batch, skip_logits=False)
        if kept.logits is None:
            problems.append("skip_logits=False in training mode returned no logits")
        skipped = model(**batch, skip_logits=True)
        if skipped.logits is not None:
            problems.append("skip_logits=True returned logits")
        for label, out in (
            ("skip_logits=None", default),
            ("skip_logits=False", kept),
            ("skip_logits=True", skipped),
        ):
            if not _loss_close(out.loss, reference):
                problems.append(f"{label}: loss {out.loss} differs from the unpatched loss {reference}")
        try:
            model(**no_labels, skip_logits=True)
            problems.append("skip_logits=True without labels did not raise ValueError")
        except ValueError:
            pass
        except Exception as exc:  # the lint reports a crashing forward, it does not crash with it
            problems.append(
                f"skip_logits=True without labels raised {type(exc).__name__}, not ValueError: {exc}"
            )
        model.eval()
        evaluated = model(**batch)
        if (evaluated.logits is None) != (mode == "labels"):
            problems.append(
                f"eval with labels and skip_logits=None (mode {mode}): logits {'missing' if evaluated.logits is None else 'returned'}"
            )
    return problems
