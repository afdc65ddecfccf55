"""Resolves the names in a family entry (module, classes, functions) against the installed transformers."""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from liger_registry.attr_path import read_path, text_config
from liger_registry.registry.errors import RegistryError
from liger_registry.schemas import KINDS, FamilyEntry
from liger_registry.schemas.defaults import default
from liger_registry.schemas.family import HEAD_CONFIG_ATTRS


def transformers_version() -> str:
    return transformers.__version__


def supported_range(entry: FamilyEntry) -> SpecifierSet:
    """The family's `transformers` range within the defaults' (a family narrows it, InternLM3 to >=5.24; it never
    widens it, so one edit of the defaults file still bumps every family)."""
    return SpecifierSet(default("transformers")) & SpecifierSet(entry.transformers)


def version_problem(entry: FamilyEntry) -> str | None:
    installed = Version(transformers_version())
    if installed.is_prerelease or installed.is_devrelease:
        installed = Version(installed.base_version)
    if installed not in (supported := supported_range(entry)):
        return (
            f"family {entry.family!r} supports transformers{supported}; installed is {transformers_version()}"
        )
    return None


def import_module(name: str, family: str) -> ModuleType:
    if not name.startswith("transformers."):
        raise RegistryError(
            f"family {family!r}: refusing to import {name!r}: only modules under transformers."
        )
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RegistryError(
            f"family {family!r}: module {name} is not in the installed transformers {transformers_version()}: {exc}"
        ) from exc


def resolve_name(entry: FamilyEntry, name: str) -> tuple[ModuleType, str]:
    """The module and attribute a target names: 'Class' in the family module, or 'transformers.mod:Class'."""
    module_name, _, attr = name.rpartition(":")
    module = import_module(module_name or entry.module, entry.family)
    if not hasattr(module, attr):
        raise RegistryError(
            f"family {entry.family!r}: {module.__name__} has no {attr!r} in the installed transformers "
            f"{transformers_version()}"
        )
    return module, attr


def _defined_under_transformers(value: Any) -> bool:
    return str(getattr(value, "__module__", "") or "").startswith("transformers.")


def resolve_class(entry: FamilyEntry, name: str) -> type:
    """A class *defined* under transformers: a torch class a modeling module imports (``nn.LayerNorm``) is
    refused, so a class-wide apply can never replace a torch class's method process-wide."""
    module, attr = resolve_name(entry, name)
    value = getattr(module, attr)
    if not isinstance(value, type):
        raise RegistryError(f"family {entry.family!r}: {module.__name__}.{attr} is not a class")
    if not _defined_under_transformers(value):
        raise RegistryError(
            f"family {entry.family!r}: {module.__name__}.{attr} is {value.__module__}.{value.__qualname__}, "
            "defined outside transformers: only classes defined under transformers may be patched"
        )
    return value


def hub_wrapped_function(value: Any) -> Any:
    """The function inside a kernels-hub function module, else `value` itself.

    With the `kernels` package installed (a dependency of transformers >= 5.25), `use_kernel_forward_from_hub`
    turns a decorated module-level function (`apply_rotary_pos_emb`) into an `nn.Module` instance whose forward
    calls the function. The attention forwards still look that name up as a module global, so replacing it
    works as before; what it wraps is the function to check. `kernels.kernelize` routes calls through the
    module's own copy, which a patched name bypasses."""
    if inspect.isclass(value) or not hasattr(value, "kernel_layer_name"):
        return value
    forward = getattr(type(value), "forward", None)
    if not inspect.isfunction(forward) or not forward.__closure__:
        return value
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__, strict=True))
    try:
        inner = cells["func"].cell_contents
    except (KeyError, ValueError):
        return value
    return inner if inspect.isfunction(inner) else value


def resolve_function(entry: FamilyEntry, name: str) -> tuple[ModuleType, str]:
    """The module and name of a plain function defined under transformers (never a class, a module, a builtin
    or a torch function re-exported by a modeling module), also when the kernels hub wraps it in a module
    (:func:`hub_wrapped_function`)."""
    module, attr = resolve_name(entry, name)
    value = hub_wrapped_function(getattr(module, attr))
    if not inspect.isfunction(value):
        raise RegistryError(
            f"family {entry.family!r}: {module.__name__}.{attr} is a {type(value).__name__}, not a function"
        )
    # a function of ours there is the replacement an earlier apply installed (module-wide, shared by handles)
    if not (_defined_under_transformers(value) or value.__module__.startswith("liger_registry.")):
        raise RegistryError(
            f"family {entry.family!r}: {module.__name__}.{attr} is defined in {value.__module__}, outside "
            "transformers: only functions defined under transformers may be replaced"
        )
    return module, attr


HEAD_MODULE_ATTRS = ("lm_head", "base_model")


def head_problems(entry: FamilyEntry, model: Any = None, config: Any = None) -> list[str]:
    """The head's attribute names against what they name: each config attribute on the language config (the
    model's, or by default the model type's default config; `head.optional_attrs` may be absent), and lm_head /
    base_model on the model (when there is one). A misspelt name would otherwise silently skip its transform, or fail at the first forward."""
    head = entry.head
    if head is None:
        return []
    problems = []
    names = {key: getattr(head, key) for key in HEAD_CONFIG_ATTRS if getattr(head, key) is not None}
    if names:
        try:
            config = config if config is not None else default_language_config(entry)
        except (ValueError, KeyError, TypeError, RegistryError) as exc:
            return [f"family {entry.family!r}: cannot build the default config to check the head: {exc}"]
        problems += [
            f"family {entry.family!r}: head.{key}: {type(config).__name__} has no attribute {name!r}"
            for key, name in names.items()
            if not hasattr(config, name) and name not in head.optional_attrs
        ]
    try:
        holder = model if model is not None else resolve_class(entry, entry.causal_lm)
    except RegistryError:  # reported by target_problems
        return problems
    problems += [
        f"family {entry.family!r}: head.{key}: {p}"
        for key in HEAD_MODULE_ATTRS
        if (p := _module_problem(holder, getattr(head, key), key == "lm_head"))
    ]
    return problems


def _module_problem(holder: Any, name: str, weighted: bool) -> str | None:
    """Why attribute `name` of a model (or, before there is one, of its class) is not the module the forward
    calls: missing, a method or other non-module, or for the head a module without a weight. On a class only
    what the class itself defines is known (modules are set in __init__)."""
    from torch import nn

    from liger_registry.forwards.head import active_head

    is_class = isinstance(holder, type)
    owner = (holder if is_class else type(holder)).__name__
    value = inspect.getattr_static(holder, name, None) if is_class else getattr(holder, name, None)
    if is_class and (value is None or isinstance(value, property)):
        return None  # set by __init__, or computed: only a model can tell
    if value is None and not hasattr(holder, name):
        return f"{owner} has no attribute {name!r}"
    if inspect.isroutine(value) or isinstance(value, (classmethod, staticmethod)):
        return f"{owner}.{name} is a method, not a module"
    if not isinstance(value, nn.Module):
        return f"{owner}.{name} is a {type(value).__name__}, not a module"
    if weighted and getattr(active_head(value), "weight", None) is None:
        return f"{owner}.{name} is a {type(value).__name__} without a weight (not an output projection)"
    return None


def target_problems(entry: FamilyEntry) -> list[str]:
    """Every name of the entry that does not resolve (for lint)."""
    problems = []
    classes, functions = [entry.causal_lm], []
    for name, kind in KINDS.items():
        spec = getattr(entry.kernels, name)
        if spec is None:
            continue
        if kind.module_forward:
            classes += spec.targets
        elif spec.enabled:
            functions.append(kind.function_name(spec))
    for name in classes:
        try:
            resolve_class(entry, name)
        except RegistryError as exc:
            problems.append(str(exc))
    for name in functions:
        try:
            resolve_function(entry, name)
        except RegistryError as exc:
            problems.append(str(exc))
    return problems


def default_language_config(entry: FamilyEntry) -> Any:
    """The language model's config with transformers' defaults, from the causal-LM class's config class."""
    config = resolve_class(entry, entry.causal_lm).config_class()
    return text_config(config, entry.head.text_config_attr if entry.head else None)


def moe_problems(entry: FamilyEntry, *holders: Any) -> list[str]:
    """The head's MoE contract against the installed transformers: the aux-loss function is in the family's
    module, and each constant the forward reads is on one of `holders` (the model and its language config, as
    the forward reads them; by default the model type's default config)."""
    moe, problems = entry.head.moe, []
    module = import_module(entry.module, entry.family)
    if not callable(getattr(module, moe.aux_loss_function, None)):
        problems.append(
            f"family {entry.family!r}: head.moe.aux_loss_function: {module.__name__} has no function "
            f"{moe.aux_loss_function!r} in the installed transformers {transformers_version()}"
        )
    try:
        holders = holders or (default_language_config(entry),)
    except (ValueError, KeyError, TypeError, RegistryError) as exc:
        return [
            *problems,
            f"family {entry.family!r}: cannot build the default config to check head.moe: {exc}",
        ]
    for constant, names in moe.attrs().items():
        if not any(read_path(h, name) is not None for h in holders for name in names):
            problems.append(
                f"family {entry.family!r}: head.moe: {' or '.join(type(h).__name__ for h in holders)} has none of "
                f"{', '.join(names)} (the {constant} the MoE forward reads)"
            )
    return problems
