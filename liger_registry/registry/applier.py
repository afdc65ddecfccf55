"""The one generic applier: installs a resolved family into a model or its classes, and takes it back."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from liger_registry.registry.backends import decide_backends
from liger_registry.registry.class_wide import class_wide_conflicts
from liger_registry.registry.configure import configure, unwrap_model
from liger_registry.registry.errors import PatchError, RegistryError
from liger_registry.registry.loader import Registry, load_registry
from liger_registry.registry.plan import Planned, make_plan
from liger_registry.registry.report import PatchReport, Replacement, _name
from liger_registry.registry.resolve import ResolvedConfig
from liger_registry.registry.targets import version_problem

_MISSING = object()


@dataclass
class _Shared:
    """A module-wide replacement that several handles may hold at once."""

    original: Any
    replacement: Any
    holders: int = 0


@dataclass
class _PatchRecord:
    """The only global state: what is patched now, so apply is idempotent and revert exact."""

    models: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    families: dict[str, PatchHandle] = field(default_factory=dict)
    shared: dict[tuple[int, str], _Shared] = field(default_factory=dict)


_RECORD = _PatchRecord()


@dataclass
class _Applied:
    planned: Planned
    previous: Any  # the owner's own attribute before, or _MISSING when it came from the class
    original: str  # what the attribute resolved to before, for the report

    def replacement(self) -> Replacement:
        p = self.planned
        return Replacement(p.kernel, p.scope, p.target, p.attribute, self.original, _name(p.replacement))


class PatchHandle:
    """The result of apply(): its report, and revert() to restore every attribute exactly."""

    def __init__(self, report: PatchReport, key: Any):
        self.report = report
        self._key = key
        self._applied: list[_Applied] = []

    @property
    def active(self) -> bool:
        return self._key is not None

    def _install(self, planned: Planned) -> None:
        owner, attr = planned.owner, planned.attribute
        original = _name(getattr(owner, attr))
        if planned.scope == "module":
            shared = _RECORD.shared.get((id(owner), attr))
            if shared is None:
                shared = _Shared(getattr(owner, attr), planned.replacement)
                _RECORD.shared[(id(owner), attr)] = shared
                setattr(owner, attr, planned.replacement)
            shared.holders += 1
            self._applied.append(_Applied(planned, shared.original, _name(shared.original)))
            return
        previous = vars(owner).get(attr, _MISSING)
        setattr(owner, attr, planned.replacement)
        self._applied.append(_Applied(planned, previous, original))

    def _uninstall(self, applied: _Applied) -> None:
        owner, attr = applied.planned.owner, applied.planned.attribute
        if applied.planned.scope == "module":
            shared = _RECORD.shared[(id(owner), attr)]
            shared.holders -= 1
            if shared.holders == 0:
                setattr(owner, attr, shared.original)
                del _RECORD.shared[(id(owner), attr)]
        elif applied.previous is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, applied.previous)

    def revert(self) -> None:
        """Restore every replaced attribute to the object it held before; a second call does nothing."""
        while self._applied:
            self._uninstall(self._applied.pop())
        if isinstance(self._key, str):
            _RECORD.families.pop(self._key, None)
        elif self._key is not None:
            _RECORD.models.pop(self._key, None)
        self._key = None

    def __enter__(self) -> PatchHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        return f"PatchHandle(family={self.report.family!r}, patched={len(self.report.patched)}, active={self.active})"


def _complain(problems: list[str], strict: bool, family: str) -> list[str]:
    if problems and strict:
        raise PatchError(
            f"liger_registry: cannot patch family {family!r}; nothing was changed:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n(pass strict=False to patch what fits and get these as warnings)"
        )
    for problem in problems:
        warnings.warn(f"liger_registry: {problem}", stacklevel=3)
    return problems


def _existing(key: Any, config: ResolvedConfig) -> PatchHandle | None:
    handle = _RECORD.families.get(key) if isinstance(key, str) else _RECORD.models.get(key)
    if handle is None:
        return None
    if handle.report.config.values != config.values:
        raise PatchError(
            f"already patched with other options ({handle.report.family}); call revert() first to re-apply"
        )
    return handle


def apply(
    model_or_model_type: nn.Module | str,
    *,
    policy: str | Path | list | None = None,
    strict: bool = True,
    registry: Registry | None = None,
    **overrides: Any,
) -> PatchHandle:
    """Install the family's kernels and forward into a model instance, or into its classes by model_type.

    Overrides are knob names (rms_norm=False, chunk_mem_const=8, skip_logits="never", ...); an unknown one
    is an error. Idempotent: applying the same configuration again returns the same handle.
    """
    config = configure(model_or_model_type, policy, registry, **overrides)
    is_type = isinstance(model_or_model_type, str)
    model = None if is_type else unwrap_model(model_or_model_type)
    key = config.family if is_type else model
    if (existing := _existing(key, config)) is not None:
        return existing
    problems = [p for p in [version_problem(config.entry)] if p]
    if model is not None and (conflicts := class_wide_conflicts(config, model, _RECORD.families)):
        problems += conflicts
        if strict:  # before planning: an instance plan on top of a class-wide patch is not made at all
            _complain(problems, strict, config.family)
    try:
        plan = make_plan(config, model)
    except RegistryError as exc:
        raise PatchError(f"liger_registry: cannot patch family {config.family!r}: {exc}") from exc
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
    handle.report.patched = [a.replacement() for a in handle._applied]
    if model is not None:
        _decide_backends(handle.report, model)
    if not is_type and any(a.planned.scope == "module" for a in handle._applied):
        handle.report.warnings.append(
            "module-level functions (e.g. rotary embedding) are patched module-wide"
        )
    if is_type:
        _RECORD.families[key] = handle
    else:
        _RECORD.models[key] = handle
    return handle


def _decide_backends(report: PatchReport, model: Any) -> None:
    """The backend each installed kernel uses for the model's device and dtype, with the reasons (report only)."""
    parameter = next(iter(model.parameters()), None)
    if parameter is None:
        return
    report.backends = decide_backends(report.config.entry, parameter.device, parameter.dtype)
    report.backends_for = f"{parameter.device} / {str(parameter.dtype).removeprefix('torch.')}"


def revert(model_or_model_type: nn.Module | str) -> bool:
    """Take back what apply() installed on this model (or model type); False when nothing was patched."""
    if isinstance(model_or_model_type, str):
        registry = load_registry()
        family = registry.family_for(model_or_model_type).entry.family
        handle = _RECORD.families.get(family)
    else:
        handle = _RECORD.models.get(unwrap_model(model_or_model_type))
    if handle is None:
        return False
    handle.revert()
    return True


@contextlib.contextmanager
def patched(model_or_model_type: nn.Module | str, **kwargs: Any):
    """`with patched(model): ...` applies on entry and reverts on exit, also when the body raises.

    On a model (or model type) that is already patched the same way the block finds that patch and leaves it in
    place on exit: a block restores exactly the state it found (nested blocks too).
    """
    active_before = {id(h) for h in (*_RECORD.models.values(), *_RECORD.families.values())}
    handle = apply(model_or_model_type, **kwargs)
    try:
        yield handle
    finally:
        if id(handle) not in active_before:
            handle.revert()


def patch_handle(model_or_model_type: nn.Module | str) -> PatchHandle | None:
    if isinstance(model_or_model_type, str):
        return _RECORD.families.get(model_or_model_type)
    return _RECORD.models.get(unwrap_model(model_or_model_type))
