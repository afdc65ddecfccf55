"""Reads an attribute a spec names by one name or by alternatives (a name transformers renamed between releases)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def attr_reader(names: str | list[str]) -> Callable[[Any], Any]:
    """``module -> value`` of ``names``: one attribute, or the first of a list the module has. Plain functions
    (not ``operator.attrgetter``, which torch.compile cannot trace without a graph break)."""
    if isinstance(names, str) or len(names) == 1:
        name = names if isinstance(names, str) else names[0]

        def read_one(module: Any) -> Any:
            return getattr(module, name)

        return read_one
    alternatives = tuple(names)

    def read_first(module: Any) -> Any:
        for candidate in alternatives:
            if hasattr(module, candidate):
                return getattr(module, candidate)
        raise AttributeError(f"{type(module).__name__} has none of the attributes {', '.join(alternatives)}")

    return read_first


def has_attr(module: Any, names: str | list[str] | tuple[str, ...]) -> bool:
    """Whether the module has ``names`` (one of them, for a list; a name may be a dotted path)."""
    return any(_has_path(module, n) for n in ((names,) if isinstance(names, str) else names))


def _has_path(obj: Any, path: str) -> bool:
    for name in path.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def attr_label(names: str | list[str] | tuple[str, ...]) -> str:
    """``names`` as an error message says them: ``eps`` or ``eps or variance_epsilon``."""
    return names if isinstance(names, str) else " or ".join(names)
