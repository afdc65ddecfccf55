"""The base model's forward with default positions (see :mod:`liger_registry.forwards.positions` for why)."""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import torch
from torch import nn

from liger_registry.forwards.positions import DEFAULT_POSITIONS
from liger_registry.registry.rebind import rebind_names, wrapper_chain
from liger_registry.registry.switch import stale_switch

MASKING_MODULE = "transformers.masking_utils"


# The mask functions whose mask, for rows without padding, cache or extra mask functions, is plain causal (or a
# sliding window longer than the rows): SDPA's is_causal where eager transformers skips it
CAUSAL_MASKS = {"create_causal_mask": None, "create_sliding_window_causal_mask": "sliding_window"}
# Arguments that change that mask when given: a mask built from them is always materialised
MASK_MODIFIERS = (
    "attention_mask",
    "past_key_values",
    "cache",
    "or_mask_function",
    "and_mask_function",
    "block_sequence_ids",
    "encoder_hidden_states",
)


def _parameters(function: Any) -> tuple[str, ...] | None:
    """The mask function's parameter names, when it takes positions (None: it takes none, or is not inspectable)."""
    try:
        names = tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return names if "position_ids" in names else None


def _skipped_as_in_eager(name: str, call: dict) -> bool:
    """Whether transformers leaves this mask to SDPA's is_causal in eager mode, where it decides it under
    torch.compile too. Releases up to 5.17 build it whenever dynamo traces (their export rule), and every release
    keeps it when the rows might be packed; the rows here are not, so the compiled model gets eager's masks."""
    config = call.get("config")
    # no export check: without a cache the rows attend causally to themselves in every call an exported program
    # can take, and torch < 2.14's dynamo folds torch.compiler.is_exporting() to True while compiling
    if not torch.compiler.is_compiling():
        return False
    if any(call.get(k) is not None for k in MASK_MODIFIERS) or call.get("allow_is_causal_skip") is False:
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or not getattr(config, "is_causal", True):
        return False
    window = CAUSAL_MASKS[name] and getattr(config, CAUSAL_MASKS[name], None)
    return window is None or call["inputs_embeds"].shape[1] < window


def without_packed_check(create_mask: Any, parameters: tuple[str, ...]) -> Any:
    """``create_mask`` called with ``position_ids=None``: the mask of rows that each hold one sequence (None under
    torch.compile where eager mode has none, for the plain causal masks)."""
    name = getattr(create_mask, "__name__", "create_mask")

    def create(*args, **kwargs):
        call = {**dict(zip(parameters, args, strict=False)), **kwargs, "position_ids": None}
        if name in CAUSAL_MASKS and _skipped_as_in_eager(name, call):
            return None
        return create_mask(**call)

    create.__name__ = create.__qualname__ = name
    create.__wrapped__ = create_mask
    return create


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the functions defined in it (lambdas, comprehensions) read: some forwards
    build their masks inside a lambda, which reads the globals of the function that creates it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def mask_functions(method: Any) -> tuple[types.ModuleType, dict[str, Any]] | None:
    """The modeling module of ``method`` and, by the global name it reads them under, the transformers mask
    functions it calls that take positions; None when it calls none."""
    if not isinstance(method, types.FunctionType):
        return None
    inner = wrapper_chain(method)[-1]
    module = sys.modules.get(inner.__module__)
    if module is None or inner.__globals__ is not vars(module):
        return None
    found = {}
    for name in _global_names(inner.__code__):
        value = vars(module).get(name)
        if getattr(value, "__module__", None) == MASKING_MODULE and callable(value):
            parameters = _parameters(value)
            if parameters is not None:
                found[name] = without_packed_check(value, parameters)
    return (module, found) if found else None


def default_positions_forward(cls: type) -> Any | None:
    """A forward for instances of ``cls`` (used as a method) that runs a copy of the class's forward without the
    packed-sequence check when called with ``DEFAULT_POSITIONS=True``, and the class's forward otherwise; None
    when that forward builds no mask with positions or cannot be copied."""
    method = vars(cls).get("forward") or getattr(cls, "forward", None)
    if not isinstance(method, types.FunctionType) or (found := mask_functions(method)) is None:
        return None
    unpacked = rebind_names(method, *found)
    if unpacked is None:
        return None

    def forward(self, *args, **kwargs):
        # a multimodal base model hands its text model the positions it was given (by keyword): None here
        # a multimodal base model hands its text model the positions it was given (by keyword): None here
        if kwargs.pop(DEFAULT_POSITIONS, False) and kwargs.get("position_ids") is None:
            return unpacked(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = "default_positions_forward"
    forward.__signature__ = inspect.signature(method)
    return forward


def has_own_forward(module: nn.Module) -> bool:
    """Whether the instance holds a forward of its own (a switch a deep copy carried over is not: apply installs
    over it, as the handle does)."""
    own = vars(module).get("forward")
    return own is not None and not stale_switch(own, module)
