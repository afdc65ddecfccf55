"""The table of installable forwards, filled by the @register_forward decorator (torch-free until one is used)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

_FORWARDS: dict[str, ForwardSpec] = {}
# The built-in forwards by name and the module that registers each, imported when one is first asked for:
# a YAML file's forward name is checked without importing torch.
BUILTIN_FORWARDS = {
    "causal_lm": "liger_registry.forwards.causal_lm",
    "causal_lm_moe": "liger_registry.forwards.causal_lm",
    "original_head": "liger_registry.forwards.original_head",
}


@dataclass(frozen=True)
class ForwardSpec:
    name: str
    fn: Callable
    description: str
    fuses: bool = True  # computes the loss with FLCE when the family's flce is on; False: never fuses
    moe: bool = False  # reads the head's MoE contract (head.moe), which targets/lint check


def register_forward(
    name: str, description: str = "", *, fuses: bool = True, moe: bool = False
) -> Callable[[Callable], Callable]:
    """Register a forward under `name`; YAML entries name forwards only through this table.

    The function's signature is `(self, ctx, *args, skip_logits=None, **kwargs)`: `ctx` is the
    ForwardContext the applier binds, and `skip_logits` must be a named parameter (the lint checks it).
    """

    def decorate(fn: Callable) -> Callable:
        if problem := _name_taken(name, fn):
            raise ValueError(problem)
        doc = description or (inspect.getdoc(fn) or "").split("\n")[0]
        _FORWARDS[name] = ForwardSpec(name, fn, doc, fuses, moe)
        return fn

    return decorate


def _qualified(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _name_taken(name: str, fn: Callable) -> str | None:
    """Why `fn` may not take `name`: another function has it, or it is a built-in's (taken before the built-in's
    module is imported: a plugin loads first, and would otherwise replace it for every family)."""
    if name in _FORWARDS and _qualified(_FORWARDS[name].fn) != _qualified(fn):
        return (
            f"a forward named {name!r} is already registered ({_qualified(_FORWARDS[name].fn)}); "
            f"{_qualified(fn)} cannot be registered under the same name"
        )
    module = BUILTIN_FORWARDS.get(name)
    if module is not None and getattr(fn, "__module__", None) != module:
        return (
            f"{name!r} is the built-in forward of {module}; {_qualified(fn)} cannot be registered under "
            "the same name"
        )
    return None


def forward_names() -> set[str]:
    """Every forward a YAML file may name: the built-ins (not imported) and those registered so far."""
    return set(BUILTIN_FORWARDS) | set(_FORWARDS)


def get_forward(name: str) -> ForwardSpec:
    if name not in _FORWARDS and name in BUILTIN_FORWARDS:
        importlib.import_module(BUILTIN_FORWARDS[name])
    if name not in _FORWARDS:
        import difflib

        close = difflib.get_close_matches(name, sorted(forward_names()), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"no forward named {name!r} is registered.{hint} Registered: {', '.join(sorted(forward_names()))}"
        )
    return _FORWARDS[name]


def registered_forwards() -> dict[str, ForwardSpec]:
    """Every forward, the built-ins imported."""
    for module in sorted(set(BUILTIN_FORWARDS.values())):
        importlib.import_module(module)
    return dict(_FORWARDS)
