"""Finds what a transformers model type is made of: its modeling module, head class, and candidate modules."""

from __future__ import annotations

import importlib
import inspect as pyinspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from liger_registry.registry.targets import hub_wrapped_function

_CONFIG_REF = re.compile(r"\bconfig\.(\w+)")
_SELF_REF = re.compile(r"\bself\.(\w+)")
_SELF_FROM_CONFIG = re.compile(r"self\.(\w+)\s*=\s*(?:self\.)?config\.(\w+)")


@dataclass(frozen=True)
class ModelSource:
    """The installed transformers code of one causal-LM model type."""

    model_type: str
    causal_lm: type
    module: ModuleType

    @property
    def module_name(self) -> str:
        return self.module.__name__


def causal_lm_types() -> dict[str, str]:
    """Every model type transformers registers for AutoModelForCausalLM, with its class name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def model_source(model_type: str) -> ModelSource:
    """The causal-LM class of `model_type` and the module that defines it; KeyError if none is registered."""
    names = causal_lm_types()
    if model_type not in names:
        raise KeyError(f"transformers registers no causal-LM class for model type {model_type!r}")
    import transformers

    cls = getattr(transformers, names[model_type])
    return ModelSource(model_type, cls, importlib.import_module(cls.__module__))


@dataclass
class Captured:
    """The modules of one class in a built model, with the inputs each one saw in a forward pass."""

    cls: type
    instances: list[nn.Module] = field(default_factory=list)
    inputs: list[tuple] = field(default_factory=list)
    target: str = ""  # how a family entry of the module names the class


def target_name(cls: type, module: ModuleType) -> str:
    """`Class` when the family's module has it, else `transformers.<module>:Class` (a class imported from, or
    defined in, another module)."""
    return cls.__name__ if getattr(module, cls.__name__, None) is cls else f"{cls.__module__}:{cls.__name__}"


def _from_transformers(cls: type) -> bool:
    return cls.__module__.startswith("transformers.")


def module_classes(model: nn.Module, select: Callable[[type], bool]) -> dict[str, Captured]:
    """Instances of every transformers class `select` accepts, by class name, in model order."""
    found: dict[str, Captured] = {}
    for module in model.modules():
        cls = type(module)
        if _from_transformers(cls) and select(cls):
            found.setdefault(cls.__name__, Captured(cls)).instances.append(module)
    return found


def capture_inputs(model: nn.Module, found: dict[str, Captured], run: Callable[[], Any]) -> None:
    """Run `run()` once and keep the first positional inputs each captured module received."""
    handles = []
    for captured in found.values():
        for module in captured.instances:

            def hook(mod, args, kwargs, captured=captured):
                if len(captured.inputs) < 4:
                    captured.inputs.append(
                        tuple(a.detach().clone() if torch.is_tensor(a) else a for a in args)
                    )

            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()


def record_calls(
    module: ModuleType, name: str, run: Callable[[], Any], limit: int = 4
) -> list[tuple[tuple, dict]]:
    """The (args, kwargs) of the first calls to the module-level function `name` while `run()` runs."""
    original = getattr(module, name)
    calls: list[tuple[tuple, dict]] = []

    def recorder(*args, **kwargs):
        if len(calls) < limit:
            calls.append((tuple(a.detach().clone() if torch.is_tensor(a) else a for a in args), dict(kwargs)))
        return original(*args, **kwargs)

    setattr(module, name, recorder)
    try:
        with torch.no_grad():
            run()
    finally:
        setattr(module, name, original)
    return calls


def rotary_functions(module: ModuleType) -> list[str]:
    """Module-level functions of the module named like a rotary embedding (apply_rotary_pos_emb, ...)."""
    return sorted(
        n
        for n, v in vars(module).items()
        if n.startswith("apply_rotary") and _defined_in(hub_wrapped_function(v), module)
    )


def _defined_in(value: Any, module: ModuleType) -> bool:
    return pyinspect.isfunction(value) and value.__module__ == module.__name__


def config_names_read(cls: type, method: str = "forward") -> set[str]:
    """Config attributes a class's method reads, directly or through `self.x = config.y` set in __init__."""
    try:
        source = pyinspect.getsource(getattr(cls, method))
        init = pyinspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return set()
    aliases = dict(_SELF_FROM_CONFIG.findall(init))
    names = set(_CONFIG_REF.findall(source))
    names |= {aliases[n] for n in _SELF_REF.findall(source) if n in aliases}
    return names


def source_mentions(cls: type, text: str, method: str = "forward") -> bool:
    try:
        return text in pyinspect.getsource(getattr(cls, method))
    except (OSError, TypeError):
        return False


def child_name(parent: nn.Module, child: nn.Module | None) -> str | None:
    """The attribute name under which `parent` holds `child` directly."""
    if child is None:
        return None
    return next((name for name, module in parent.named_children() if module is child), None)
