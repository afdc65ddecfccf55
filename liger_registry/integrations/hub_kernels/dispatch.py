"""Which of our kernels serves a transformers class (or rotary function) a kernel layer replaces: the one the
registry's family entries install on that exact class or function, or none.

transformers declares one hub name for many layers that compute differently ("RMSNorm" with its casting and
offset, "rotary_pos_emb" in half a dozen layouts), and `kernels` replaces every layer of a name with one
layer class. The family entries already say, per class and per function, which of our kernels computes exactly
what it computes (proved by `lint --deep` and the parity suite), so the layers look it up there; a class or
function no entry serves keeps its own computation. Each class is resolved once; :func:`prepare` resolves a
model's classes ahead of the first call, so that a compiled forward finds them in the tables.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from liger_registry.modules import wiring
from liger_registry.schemas import KINDS

# the hub names transformers declares that a layer of ours serves -> the kind the registry installs there
NORM_NAME = "RMSNorm"
ROTARY_NAME = "rotary_pos_emb"
_MISSING = object()
_NORMS: dict[type, Callable | None] = {}  # class -> our forward for it, None for its own
_ROTARIES: dict[type, Callable | None] = {}  # kernels' function-module class -> our drop-in, None for its own
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Served:
    """What the registry serves, by name: (module, class) -> rms_norm spec, (module, function) -> rope spec."""

    norms: dict[tuple[str, str], Any]
    rotaries: dict[tuple[str, str], Any]


def _qualified(entry: Any, name: str) -> tuple[str, str]:
    module, _, attr = name.rpartition(":")
    return module or entry.module, attr


def _options(spec: Any) -> dict:
    return spec.model_dump(exclude={"targets", "function", "enabled", "reason"})


def _agreeing(table: dict, key: tuple[str, str], spec: Any, conflicts: set) -> None:
    """Entries that name one class or function with different options serve it with neither."""
    if key in table and _options(table[key]) != _options(spec):
        conflicts.add(key)
    table[key] = spec


@cache
def served() -> Served:
    """Every class and function the registry's enabled rms_norm and rope kernels replace, on the installed
    transformers (families whose range leaves it out are not read)."""
    from liger_registry.registry import load_registry
    from liger_registry.registry.resolve import resolve
    from liger_registry.registry.targets import version_problem

    registry = load_registry()
    norms, rotaries, conflicts = {}, {}, set()
    for loaded in registry.families.values():
        if version_problem(loaded.entry):
            continue
        entry = resolve(registry, loaded).entry
        norm, rope = entry.kernels.rms_norm, entry.kernels.rope
        if norm is not None and norm.enabled:
            for target in norm.targets:
                _agreeing(norms, _qualified(entry, target), norm, conflicts)
        if rope is not None and rope.enabled:
            key = _qualified(entry, KINDS["rope"].function_name(rope))
            _agreeing(rotaries, key, rope, conflicts)
    for key in conflicts:
        norms.pop(key, None)
        rotaries.pop(key, None)
    return Served(norms, rotaries)


def _named(table: dict[tuple[str, str], Any], obj: Any) -> Any:
    """The spec whose (module, name) names `obj` in a module imported so far (a family module may name a
    class it imports from another family's), None if none does."""
    spec = table.get((getattr(obj, "__module__", None), getattr(obj, "__name__", None)))
    if spec is not None and getattr(sys.modules.get(obj.__module__), obj.__name__, None) is obj:
        return spec
    for (module_name, attr), spec in table.items():
        if getattr(sys.modules.get(module_name), attr, None) is obj:
            return spec
    return None


def _norm_forward(cls: type) -> Callable | None:
    spec = _named(served().norms, cls)
    return None if spec is None else wiring.maker("rms_norm", spec.variant)(spec)


def _takes_rotary_call(dropin: Callable) -> bool:
    """The drop-in takes the call transformers makes: (q, k, cos, sin, unsqueeze_dim=...)."""
    try:
        inspect.signature(dropin).bind(None, None, None, None, unsqueeze_dim=1)
    except TypeError:
        return False
    return True


def _rotary_dropins() -> dict[type, Callable | None]:
    """The drop-in of each served rotary function of the modeling modules imported so far, by the class of the
    module `kernels` made of it (one class per decorated function, in every `kernels` release)."""
    found = {}
    for (module_name, attr), spec in served().rotaries.items():
        module = sys.modules.get(module_name)
        wrapped = getattr(module, attr, None)
        if wrapped is None or not hasattr(wrapped, "kernel_layer_name"):
            continue
        dropin = wiring.maker("rope", spec.variant)
        found[type(wrapped)] = dropin if _takes_rotary_call(dropin) else None
    return found


@torch.compiler.disable
def _resolve(table: dict[type, Callable | None], cls: type) -> Callable | None:
    with _LOCK:
        if cls not in table:
            if table is _NORMS:
                table[cls] = _norm_forward(cls)
            else:
                table.update({k: v for k, v in _rotary_dropins().items() if k not in table})
                table.setdefault(cls, None)
        return table[cls]


def norm_forward(cls: type) -> Callable | None:
    """Our forward for instances of `cls` (called as ``forward(module, hidden_states)``), None for its own."""
    found = _NORMS.get(cls, _MISSING)
    return _resolve(_NORMS, cls) if found is _MISSING else found


def rotary_function(cls: type) -> Callable | None:
    """Our drop-in for the rotary function whose kernels module class is `cls`, None for its own."""
    found = _ROTARIES.get(cls, _MISSING)
    return _resolve(_ROTARIES, cls) if found is _MISSING else found


def hub_layers(model: torch.nn.Module) -> list[tuple[str, str, torch.nn.Module]]:
    """(name, hub name, module) of every layer of `model` that declares a hub name we serve: modules, and the
    function modules `kernels` attaches to them (named ``<module>.<function>``)."""
    found = []
    for name, module in model.named_modules():
        layer_name = getattr(type(module), "kernel_layer_name", None)
        if layer_name in (NORM_NAME, ROTARY_NAME):
            found.append((name, layer_name, module))
        for func_name, func in (getattr(module, "_kernel_funcs", None) or {}).items():
            if getattr(type(func), "kernel_layer_name", None) in (NORM_NAME, ROTARY_NAME):
                found.append((f"{name}.{func_name}" if name else func_name, func.kernel_layer_name, func))
    return found


def prepare(model: torch.nn.Module) -> None:
    """Resolve every layer class of `model` a layer of ours may replace (before a compiled first call)."""
    for _, layer_name, module in hub_layers(model):
        (norm_forward if layer_name == NORM_NAME else rotary_function)(type(module))
