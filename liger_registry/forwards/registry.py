"""The table of installable forwards, filled by the @register_forward decorator."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

_FORWARDS: dict[str, ForwardSpec] = {}


@dataclass(frozen=True)
class ForwardSpec:
    name: str
    fn: Callable
    description: str
    fuses: bool = True  # computes the loss with FLCE when the family's flce is on; False: never fuses


def register_forward(
    name: str, description: str = "", *, fuses: bool = True
) -> Callable[[Callable], Callable]:
    """Register a forward under `name`; YAML entries name forwards only through this table.

    The function's signature is `(self, ctx, *args, skip_logits=None, **kwargs)`: `ctx` is the
    ForwardContext the applier binds, and `skip_logits` must be a named parameter (the lint checks it).
    """

    def decorate(fn: Callable) -> Callable:
        if name in _FORWARDS and _FORWARDS[name].fn is not fn:
            raise ValueError(
                f"a forward named {name!r} is already registered ({_FORWARDS[name].fn.__module__})"
            )
        doc = description or (inspect.getdoc(fn) or "").split("\n")[0]
        _FORWARDS[name] = ForwardSpec(name, fn, doc, fuses)
        return fn

    return decorate


def get_forward(name: str) -> ForwardSpec:
    if name not in _FORWARDS:
        import difflib

        close = difflib.get_close_matches(name, list(_FORWARDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"no forward named {name!r} is registered.{hint} Registered: {', '.join(sorted(_FORWARDS))}"
        )
    return _FORWARDS[name]


def registered_forwards() -> dict[str, ForwardSpec]:
    return dict(_FORWARDS)
