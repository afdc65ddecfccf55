"""Reads an attribute a spec names by one name or by alternatives (a name transformers renamed between releases)."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any


def attr_reader(names: str | list[str]) -> Callable[[Any], Any]:
    """``module -> value`` of ``names``: one attribute, or the first of a list the module has."""
    if isinstance(names, str):
        return attrgetter(names)
    if len(names) == 1:
        return attrgetter(names[0])
    alternatives = tuple(names)

    def read(module: Any) -> Any:
        for name in alternatives:
            value = getattr(module, name, _MISSING)
            if value is not _MISSING:
                return value
        raise AttributeError(f"{type(module).__name__} has none of the attributes {', '.join(alternatives)}")

    return read


def has_attr(module: Any, names: str | list[str]) -> bool:
    """Whether the module has ``names`` (one of them, for a list)."""
    return any(hasattr(module, n) for n in ((names,) if isinstance(names, str) else names))


_MISSING = object()
