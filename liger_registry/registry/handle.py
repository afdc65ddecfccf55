"""The result of apply(): what was installed where, and revert() that restores exactly what it replaced."""

from __future__ import annotations

import logging
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

from liger_registry.registry.plan import Planned
from liger_registry.registry.record import LOCK, RECORD, Shared
from liger_registry.registry.report import PatchReport, Replacement, _name
from liger_registry.registry.switch import MISSING, SwitchState, make_switch, stale_switch

logger = logging.getLogger(__name__)


def _ref(obj: Any) -> Any:
    """A weak reference to a model's module (a dropped model is collected); classes and modules strongly."""
    return weakref.ref(obj) if not isinstance(obj, (type, types.ModuleType)) else (lambda: obj)


@dataclass
class _Applied:
    """One installed replacement. Holds no model strongly: the record must not keep a dropped model alive."""

    replacement: Replacement
    owner: Any  # () -> the object whose attribute was replaced (None once collected)
    attribute: str  # the attribute actually set (accelerate's `_old_forward` when it wraps `forward`)
    installed: Any  # () -> the object set on the owner (a switch), or the shared record entry (module scope)


def _innermost(owner: Any, attribute: str) -> str:
    """The attribute that holds the forward to replace: accelerate's hooks keep the module's own forward in
    `_old_forward` and call it from the wrapper they set as `forward`; replacing that keeps the hook working."""
    if (
        attribute == "forward"
        and getattr(owner, "_hf_hook", None) is not None
        and "_old_forward" in vars(owner)
    ):
        return "_old_forward"
    return attribute


def _ours(value: Any, switch: Any) -> bool:
    return value is switch or getattr(value, "__func__", None) is switch


class PatchHandle:
    """The result of apply(): its report, and revert() to restore every attribute exactly."""

    def __init__(self, report: PatchReport, key: Any):
        self.report = report
        self._key = key if isinstance(key, str) or key is None else weakref.ref(key)
        self._applied: list[_Applied] = []

    @property
    def active(self) -> bool:
        return self._key is not None

    @property
    def model(self) -> Any:
        """The patched model (None for a class-wide patch, or once reverted or collected)."""
        return None if self._key is None or isinstance(self._key, str) else self._key()

    def _install(self, planned: Planned) -> None:
        owner = planned.owner
        original = _name(getattr(owner, planned.attribute))
        if planned.scope == "module":
            self._install_shared(planned)
            return
        attribute = _innermost(owner, planned.attribute)
        previous = vars(owner).get(attribute, MISSING)
        if stale_switch(previous, owner):
            previous = MISSING
        state = SwitchState(owner, attribute, previous)
        function = getattr(planned.replacement, "__func__", planned.replacement)
        switch = make_switch(function, state)
        setattr(owner, attribute, switch if planned.scope == "class" else types.MethodType(switch, owner))
        replacement = Replacement(
            planned.kernel, planned.scope, planned.target, planned.attribute, original, _name(function)
        )
        self._applied.append(_Applied(replacement, _ref(owner), attribute, weakref.ref(switch)))

    def _install_shared(self, planned: Planned) -> None:
        owner, attribute = planned.owner, planned.attribute
        shared = RECORD.shared.get((id(owner), attribute))
        if shared is None:
            shared = Shared(getattr(owner, attribute), planned.replacement)
            RECORD.shared[(id(owner), attribute)] = shared
            setattr(owner, attribute, planned.replacement)
        shared.holders += 1
        replacement = Replacement(
            planned.kernel,
            "module",
            planned.target,
            attribute,
            _name(shared.original),
            _name(shared.replacement),
        )
        self._applied.append(_Applied(replacement, _ref(owner), attribute, lambda: shared))

    def _uninstall(self, applied: _Applied) -> None:
        owner = applied.owner()
        if owner is None:
            return
        if applied.replacement.scope == "module":
            self._uninstall_shared(owner, applied)
            return
        switch = applied.installed()
        if (
            switch is None
        ):  # nothing holds the switch any more: someone replaced it, and not by a wrapper of it
            if (current := vars(owner).get(applied.attribute, MISSING)) is not MISSING:
                _left_in_place(applied, current)
            return
        state: SwitchState = switch.__liger_switch__
        state.live = False
        current = vars(owner).get(applied.attribute, MISSING)
        if _ours(current, switch):
            _restore(owner, applied.attribute, state.previous)
        elif not _unwrap_accelerate(owner, switch, state):
            _left_in_place(applied, current)

    def _uninstall_shared(self, owner: Any, applied: _Applied) -> None:
        shared = applied.installed()
        shared.holders -= 1
        if shared.holders > 0:
            return
        del RECORD.shared[(id(owner), applied.attribute)]
        current = getattr(owner, applied.attribute, MISSING)
        if current is shared.replacement:
            setattr(owner, applied.attribute, shared.original)
        else:
            _left_in_place(applied, current)

    def revert(self) -> None:
        """Restore every replaced attribute to the object it held before; a second call does nothing.

        An attribute that someone else replaced after apply is left as they set it (with a warning); what apply
        installed under it then passes every call through to the original.
        """
        with LOCK:
            restored, was_active = len(self._applied), self.active
            while self._applied:
                self._uninstall(self._applied.pop())
            if was_active:
                logger.info(
                    "revert: family %s (%s): %d replacement(s) restored",
                    self.report.family,
                    self.report.scope,
                    restored,
                )
            if isinstance(self._key, str):
                if RECORD.families.get(self._key) is self:
                    del RECORD.families[self._key]
            elif self._key is not None and (model := self._key()) is not None:
                if RECORD.models.get(model) is self:
                    del RECORD.models[model]
            self._key = None

    def __enter__(self) -> PatchHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        return f"PatchHandle(family={self.report.family!r}, patched={len(self.report.patched)}, active={self.active})"


def _restore(owner: Any, attribute: str, previous: Any) -> None:
    if previous is MISSING:
        delattr(owner, attribute)
    else:
        setattr(owner, attribute, previous)


def _unwrap_accelerate(owner: Any, switch: Any, state: SwitchState) -> bool:
    """Accelerate hooked the module after apply: its wrapper calls `_old_forward`, our switch; put the original
    there instead, so the hook keeps working on the original forward."""
    if state.attribute != "forward" or not _ours(vars(owner).get("_old_forward"), switch):
        return False
    if state.previous is MISSING:
        owner._old_forward = types.MethodType(type(owner).forward, owner)
    else:
        owner._old_forward = state.previous
    return True


def _left_in_place(applied: _Applied, current: Any) -> None:
    r = applied.replacement
    warnings.warn(
        f"liger_registry: revert: {r.target}.{applied.attribute} was replaced after apply by {_name(current)}; "
        "left as it is (the patch under it is switched off and passes calls through to the original)",
        stacklevel=4,
    )
