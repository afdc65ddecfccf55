"""The table of what installs each kernel kind, filled by the @makes and @checks decorators where each is defined.

A kind's maker is, for a module-forward kind, ``maker(spec) -> forward`` (the forward that replaces the method of
each target class), and for a module-function kind the drop-in function itself; a variant (``spec.variant``, e.g.
a fused ``gate_up`` or a RoPE layout) registers its own. A check is ``check(spec, entry, class or module,
resolve_class) -> problem or None``, run on each target before the maker. The schema (``KINDS``) says what a kind
is; this table says what installs it. Torch-free until a lookup imports the maker modules.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import cache

from liger_registry.schemas import KINDS

_MAKERS: dict[tuple[str, str], Callable] = {}
_CHECKS: dict[str, Callable] = {}


def _label(kind: str, variant: str) -> str:
    return f"{kind} ({variant})" if variant else kind


def _qualified(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _register(table: dict, key, fn: Callable, what: str) -> None:
    if key in table and _qualified(table[key]) != _qualified(fn):
        raise ValueError(
            f"{what} is already registered ({_qualified(table[key])}); {_qualified(fn)} cannot be"
        )
    table[key] = fn


def _unknown(kind: str, variant: str = "") -> str | None:
    """Why (kind, variant) is not one KINDS declares, None when it is."""
    if kind not in KINDS:
        return f"no kernel kind {kind!r} in KINDS; kinds: {', '.join(KINDS)}"
    variants = [v for v, _ in KINDS[kind].variants]
    if variant and variant not in variants:
        return f"kind {kind!r} has no variant {variant!r}; its variants: {', '.join(variants) or 'none'}"
    return None


def _known(kind: str, variant: str = "") -> None:
    if problem := _unknown(kind, variant):
        raise ValueError(problem)


def makes(kind: str, *, variant: str = "") -> Callable[[Callable], Callable]:
    """Register the decorated function as the maker (or drop-in) of `kind`, or of one of its variants."""
    _known(kind, variant)

    def decorate(fn: Callable) -> Callable:
        _register(_MAKERS, (kind, variant), fn, f"the maker of {_label(kind, variant)}")
        return fn

    return decorate


def checks(kind: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as the check `kind` runs on each of its targets."""
    _known(kind)

    def decorate(fn: Callable) -> Callable:
        _register(_CHECKS, kind, fn, f"the check of {kind}")
        return fn

    return decorate


@cache
def _import_makers() -> None:
    """Import every module of this package, so each maker and check has registered itself."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{info.name}")


def registered_makers() -> dict[tuple[str, str], Callable]:
    """Every registered maker by (kind, variant); "" is the kind's own."""
    _import_makers()
    return dict(_MAKERS)


def maker(kind: str, variant: str = "") -> Callable:
    """The maker (or drop-in) of `kind`'s `variant` ("" = the kind's own)."""
    makers = registered_makers()
    if (kind, variant) not in makers:
        registered = ", ".join(_label(*key) for key in sorted(makers)) or "none"
        fix = _unknown(kind, variant) or (
            f"decorate it with @makes({kind!r}{f', variant={variant!r}' if variant else ''}) "
            "in liger_registry.modules"
        )
        raise LookupError(
            f"no maker is registered for kernel kind {kind!r}, variant {variant!r}: {fix}. Registered: {registered}"
        )
    return makers[kind, variant]


def check(kind: str) -> Callable | None:
    """The check `kind` runs on its targets, None when it has none."""
    _import_makers()
    return _CHECKS.get(kind)
