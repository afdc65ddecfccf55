"""A replacement method that steps aside once reverted, so wrappers that captured it reach the original.

Other libraries wrap a module's forward after apply (accelerate's hooks and mixed-precision autocast keep the
patched forward in a closure). Revert cannot reach into their closures, so what apply installs is a switch:
live, it runs the replacement; reverted (or called on a deep copy of the module it was installed on), it runs
what the attribute held before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MISSING = object()


@dataclass
class SwitchState:
    owner: Any  # the module (instance scope) or class the switch was installed on
    attribute: str
    previous: Any  # the owner's own attribute before, or MISSING when it came from the class
    live: bool = True


def _fallback(state: SwitchState, instance: Any) -> Callable:
    """What the attribute meant before apply, for `instance` (the owner, a deep copy of it, or an instance of the
    patched class)."""
    if isinstance(state.owner, type):
        if state.previous is not MISSING:
            return state.previous.__get__(instance, type(instance))
        for base in state.owner.__mro__[1:]:
            if state.attribute in vars(base):
                return vars(base)[state.attribute].__get__(instance, type(instance))
        raise AttributeError(f"{state.owner.__qualname__} has no {state.attribute} to fall back to")
    if state.previous is not MISSING and instance is state.owner:
        return state.previous
    return getattr(
        type(instance), "forward" if state.attribute == "_old_forward" else state.attribute
    ).__get__(instance, type(instance))


def make_switch(replacement: Callable, state: SwitchState) -> Callable:
    """A function (used as a method) that calls `replacement(self, ...)` while live on its owner, else the
    fallback; it shows the replacement's name, signature and markers."""

    @functools.wraps(replacement)
    def switch(self, *args, **kwargs):
        if state.live and (self is state.owner or isinstance(state.owner, type)):
            return replacement(self, *args, **kwargs)
        return _fallback(state, self)(*args, **kwargs)

    switch.__liger_switch__ = state
    return switch


def stale_switch(value: Any, owner: Any) -> bool:
    """A switch bound to `owner` that another module installed (owner is a deep copy of a patched module)."""
    state = getattr(getattr(value, "__func__", None), "__liger_switch__", None)
    return isinstance(state, SwitchState) and state.owner is not owner
