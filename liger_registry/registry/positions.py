"""The base model's forward with default positions (see :mod:`liger_registry.forwards.positions` for why)."""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from torch import nn

from liger_registry.forwards.positions import DEFAULT_POSITIONS
from liger_registry.registry.rebind import _chain, rebind_names

MASKING_MODULE = "transformers.masking_utils"


def _position_index(function: Any) -> int | None:
    """Where ``position_ids`` sits among the mask function's positional parameters (None: it takes none)."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("position_ids") if "position_ids" in names else None


def without_packed_check(create_mask: Any, index: int) -> Any:
    """``create_mask`` called with ``position_ids=None``: the mask of rows that each hold one sequence."""

    def create(*args, **kwargs):
        if len(args) > index:
            args = (*args[:index], None, *args[index + 1 :])
        else:
            kwargs["position_ids"] = None
        return create_mask(*args, **kwargs)

    create.__name__ = create.__qualname__ = getattr(create_mask, "__name__", "create_mask")
    create.__wrapped__ = create_mask
    return create


def mask_functions(method: Any) -> tuple[types.ModuleType, dict[str, Any]] | None:
    """The modeling module of ``method`` and, by the global name it reads them under, the transformers mask
    functions it calls that take positions; None when it calls none."""
    if not isinstance(method, types.FunctionType):
        return None
    inner = _chain(method)[-1]
    module = sys.modules.get(inner.__module__)
    if module is None or inner.__globals__ is not vars(module):
        return None
    found = {}
    for name in inner.__code__.co_names:
        value = vars(module).get(name)
        if getattr(value, "__module__", None) == MASKING_MODULE and callable(value):
            index = _position_index(value)
            if index is not None:
                found[name] = without_packed_check(value, index)
    return (module, found) if found else None


def default_positions_forward(base: nn.Module) -> Any | None:
    """A forward for ``base`` (used as a method) that runs the copy without the packed-sequence check when called
    with ``DEFAULT_POSITIONS=True`` and its class's forward otherwise; None when that forward builds no mask with
    positions or cannot be copied."""
    method = vars(type(base)).get("forward") or getattr(type(base), "forward", None)
    if not isinstance(method, types.FunctionType) or (found := mask_functions(method)) is None:
        return None
    unpacked = rebind_names(method, *found)
    if unpacked is None:
        return None

    def forward(self, *args, **kwargs):
        if kwargs.pop(DEFAULT_POSITIONS, False):
            return unpacked(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = "default_positions_forward"
    forward.__signature__ = inspect.signature(method)
    forward.__liger_default_positions__ = True
    return forward


def has_own_forward(module: nn.Module) -> bool:
    """Whether the instance holds a forward of its own (a switch that a deep copy carried over from the module it
    copied is not its own: apply installs over it, as the handle does)."""
    own = vars(module).get("forward")
    state = getattr(getattr(own, "__func__", None), "__liger_switch__", None)
    return own is not None and (state is None or state.owner is module)
