"""Per-instance patching of a module-level function: a copy of the calling method that sees the replacement.

Transformers' attention forwards call `apply_rotary_pos_emb` by its module-level name. Replacing that name
changes every model of the family in the process (a DPO reference model, a distillation teacher). Instead,
each patched model's calling modules get a copy of their class's forward whose globals map the name to the
replacement; the module, the class and every other model keep the original.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


def wrapper_chain(function: Callable) -> list[Callable]:
    """The function and the ones it wraps (functools.wraps' `__wrapped__`), outermost first."""
    chain = [function]
    while isinstance(getattr(chain[-1], "__wrapped__", None), types.FunctionType):
        chain.append(chain[-1].__wrapped__)
    return chain


def _copy(function: types.FunctionType, global_names: dict, closure: tuple | None) -> types.FunctionType:
    copied = types.FunctionType(
        function.__code__, global_names, function.__name__, function.__defaults__, closure
    )
    copied.__kwdefaults__ = function.__kwdefaults__
    copied.__qualname__ = function.__qualname__
    copied.__module__ = function.__module__
    copied.__annotations__ = function.__annotations__
    copied.__dict__.update(function.__dict__)
    return copied


def calls_function(method: Any, module: types.ModuleType, name: str) -> bool:
    """Whether `method` (or a function it wraps) is defined in `module` and reads the global `name`."""
    if not isinstance(method, types.FunctionType):
        return False
    return any(f.__globals__ is vars(module) and name in f.__code__.co_names for f in wrapper_chain(method))


def rebind(
    method: types.FunctionType, module: types.ModuleType, name: str, replacement: Any
) -> Callable | None:
    """A copy of `method` in which the global `name` of `module` is `replacement`, or None when a wrapper does
    not hold the function it wraps in a closure cell (then it cannot be copied around the change)."""
    return rebind_names(method, module, {name: replacement})


def rebind_names(
    method: types.FunctionType, module: types.ModuleType, replacements: dict[str, Any]
) -> Callable | None:
    """:func:`rebind` of several globals at once."""
    chain = wrapper_chain(method)
    inner = chain[-1]
    # A snapshot of the module's globals with the names changed. Without `__name__`: torch.compile reads the globals
    # of a dict that names a module from that module (where a name is the original), and this dict by identity.
    global_names = {k: v for k, v in vars(module).items() if k != "__name__"}
    global_names.update(replacements)
    copied = _copy(
        inner, global_names if inner.__globals__ is vars(module) else inner.__globals__, inner.__closure__
    )
    for wrapper, wrapped in zip(reversed(chain[:-1]), reversed(chain[1:]), strict=True):
        cells = wrapper.__closure__ or ()
        holds = [_holds(c, wrapped) for c in cells]
        if not any(holds):
            return None
        closure = tuple(types.CellType(copied) if h else c for c, h in zip(cells, holds, strict=True))
        inner_copy = copied
        copied = _copy(
            wrapper, global_names if wrapper.__globals__ is vars(module) else wrapper.__globals__, closure
        )
        copied.__wrapped__ = inner_copy
    return copied


def _holds(cell: types.CellType, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False
