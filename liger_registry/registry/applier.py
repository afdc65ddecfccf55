"""The one generic applier: installs a resolved family into a model or its classes, and takes it back."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from liger_registry.registry.backends import decide_backends
from liger_registry.registry.class_wide import class_wide_conflicts
from liger_registry.registry.configure import configure, unwrap_model
from liger_registry.registry.errors import PatchError, RegistryError, UnsupportedModelError
from liger_registry.registry.foreign import refuse_foreign
from liger_registry.registry.handle import PatchHandle
from liger_registry.registry.loader import Registry
from liger_registry.registry.plan import make_plan
from liger_registry.registry.record import LOCK, RECORD
from liger_registry.registry.report import PatchReport
from liger_registry.registry.resolve import ResolvedConfig
from liger_registry.registry.targets import version_problem

logger = logging.getLogger(__name__)


def _complain(problems: list[str], strict: bool, family: str) -> list[str]:
    if problems and strict:
        raise PatchError(
            f"liger_registry: cannot patch family {family!r}; nothing was changed:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n(pass strict=False to patch what fits and get these as warnings)"
        )
    for problem in problems:
        warnings.warn(f"liger_registry: {problem}", stacklevel=4)
        logger.warning("apply: family %s: strict=False, left out: %s", family, problem)
    return problems


def _existing(key: Any, config: ResolvedConfig) -> PatchHandle | None:
    handle = RECORD.families.get(key) if isinstance(key, str) else RECORD.models.get(key)
    if handle is None:
        return None
    have, asked = handle.report.config.values, config.values
    if have != asked:
        differences = [
            f"{knob}: patched {have.get(knob)!r}, asked {asked.get(knob)!r}"
            for knob in dict.fromkeys([*have, *asked])
            if have.get(knob) != asked.get(knob)
        ]
        raise PatchError(
            f"liger_registry: already patched with other options (family {handle.report.family!r}):\n"
            + "\n".join(f"  - {d}" for d in differences)
            + "\ncall revert() first to re-apply"
        )
    return handle


def apply(
    model_or_model_type: nn.Module | str,
    *,
    policy: str | Path | list | None = None,
    strict: bool = True,
    registry: Registry | None = None,
    **overrides: Any,
) -> PatchHandle | None:
    """Install the family's kernels and forward into a model instance, or into its classes by model_type.

    Overrides are knob names (rms_norm=False, chunk_mem_const=8, skip_logits="never", ...); an unknown one
    is an error. Idempotent: applying the same configuration again returns the same handle. A model type no
    family serves is an UnsupportedModelError, or with strict=False a warning and None (nothing is patched).
    """
    with LOCK:
        return _apply(model_or_model_type, policy, strict, registry, overrides)


def _apply(
    model_or_model_type, policy, strict: bool, registry: Registry | None, overrides: dict
) -> PatchHandle | None:
    try:
        config = configure(model_or_model_type, policy, registry, **overrides)
    except UnsupportedModelError as exc:
        if strict:
            raise
        warnings.warn(f"liger_registry: {exc} strict=False: left unpatched.", stacklevel=4)
        logger.warning("apply: strict=False: left unpatched: %s", exc)
        return None
    is_type = isinstance(model_or_model_type, str)
    model = None if is_type else unwrap_model(model_or_model_type)
    key = config.family if is_type else model
    if (existing := _existing(key, config)) is not None:
        return existing
    problems = [p for p in [version_problem(config.entry)] if p]
    if model is not None and (conflicts := class_wide_conflicts(config, model, RECORD.families)):
        problems += conflicts
        if strict:  # before planning: an instance plan on top of a class-wide patch is not made at all
            _complain(problems, strict, config.family)
    try:
        plan = make_plan(config, model)
    except RegistryError as exc:
        raise PatchError(f"liger_registry: cannot patch family {config.family!r}: {exc}") from exc
    refuse_foreign(plan, model, config.entry)
    warned = _complain(problems + plan.problems, strict, config.family)
    handle = PatchHandle(PatchReport(config.family, "class-wide" if is_type else "instance", config), key)
    handle.report.skipped.update(plan.skipped)
    handle.report.warnings += warned
    try:
        for planned in plan.replacements:
            handle._install(planned)
    except Exception as exc:
        handle.revert()
        raise PatchError(
            f"liger_registry: patching {config.family!r} failed half-way and was rolled back: {exc}"
        ) from exc
    handle.report.patched = [a.replacement for a in handle._applied]
    if model is not None:
        _decide_backends(handle.report, model)
    if not is_type and any(a.replacement.scope == "module" for a in handle._applied):
        handle.report.warnings.append(
            "module-level functions that no module of the model calls by name are patched module-wide"
        )
    if is_type:
        RECORD.families[key] = handle
    else:
        RECORD.models[key] = handle
    log_applied(handle.report)
    return handle


def _backend_text(report: PatchReport) -> str:
    if not report.backends:
        return "per call, by the tensors' device"
    by_backend: dict[str, list[str]] = {}
    for choice in report.backends:
        by_backend.setdefault(choice.backend, []).append(choice.kernel)
    return f"on {report.backends_for}: " + "; ".join(f"{b} ({', '.join(k)})" for b, k in by_backend.items())


def log_applied(report: PatchReport) -> None:
    """One INFO line per apply (family, kernels, backend); a WARNING per switch it skipped and per kernel that
    falls back from Triton on a CUDA model."""
    kernels = ", ".join(f"{k} x{n}" for k, n in report.counts().items()) or "nothing"
    logger.info(
        "apply: family %s (%s): %s; backend %s", report.family, report.scope, kernels, _backend_text(report)
    )
    for switch, note in report.config.noops.items():
        logger.warning("apply: family %s: switch %s skipped: %s", report.family, switch, note)
    if report.backends_for.startswith("cuda"):
        for choice in (c for c in report.backends if c.backend != "triton"):
            logger.warning(
                "apply: family %s: %s falls back to %s on %s: %s",
                report.family,
                choice.kernel,
                choice.backend,
                report.backends_for,
                choice.why(),
            )


def _decide_backends(report: PatchReport, model: Any) -> None:
    """The backend each installed kernel uses for the model's device and dtype, with the reasons (report only)."""
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        return
    report.backends = decide_backends(report.config.entry, parameter.device, parameter.dtype)
    report.backends_for = f"{parameter.device} / {str(parameter.dtype).removeprefix('torch.')}"


def revert(model_or_model_type: nn.Module | str) -> bool:
    """Take back what apply() installed on this model (or model type or family); False when nothing was patched.

    A model whose classes a class-wide patch runs (`apply("llama")`, or the reference-style
    `apply_liger_kernel_to_llama()`) has that patch taken back: the only way to unpatch it, and it unpatches every
    model of those classes (a logged WARNING says so)."""
    handle = patch_handle(model_or_model_type)
    if handle is None:
        return False
    if handle.report.scope == "class-wide" and not isinstance(model_or_model_type, str):
        logger.warning(
            "revert(model): the model runs the class-wide patch of family %r (apply(%r)); reverting it "
            "unpatches every model of its classes",
            handle.report.family,
            handle.report.family,
        )
    handle.revert()
    return True


@contextlib.contextmanager
def patched(model_or_model_type: nn.Module | str, **kwargs: Any):
    """`with patched(model): ...` applies on entry and reverts on exit, also when the body raises.

    On a model (or model type) that is already patched the same way the block finds that patch and leaves it in
    place on exit: a block restores exactly the state it found (nested blocks too). It yields None where apply
    returns None (strict=False on a model type no family serves).
    """
    with LOCK:
        active_before = {id(h) for h in RECORD.handles()}
        handle = apply(model_or_model_type, **kwargs)
    try:
        yield handle
    finally:
        if handle is not None and id(handle) not in active_before:
            handle.revert()


def patch_handle(model_or_model_type: nn.Module | str) -> PatchHandle | None:
    """The active handle of a model, or of a class-wide patch by family name or model type; None when unpatched.

    A model without a patch of its own whose model type is patched class-wide (before or after it was built: the
    classes run the kernels) gets that class-wide handle."""
    with LOCK:
        if isinstance(model_or_model_type, str):
            return RECORD.family_handle(model_or_model_type)
        model = unwrap_model(model_or_model_type)
        return RECORD.models.get(model) or RECORD.class_wide_handle(model)
