"""Finds what another patcher (the reference kernel library, Unsloth, cut-cross-entropy) already replaced in a
model or its modules, so apply refuses to stack on top of it instead of failing obscurely or half-working."""

from __future__ import annotations

from typing import Any

from torch import nn

from liger_registry.registry.errors import PatchError, RegistryError
from liger_registry.registry.plan import Plan
from liger_registry.registry.targets import resolve_name
from liger_registry.schemas import KINDS, FamilyEntry

# top-level package of a patcher's code -> how users know it
FOREIGN_PATCHERS = {
    "liger_kernel": "liger-kernel (the reference kernel library)",
    "unsloth": "Unsloth",
    "unsloth_zoo": "Unsloth",
    "cut_cross_entropy": "cut-cross-entropy",
}
SHOWN = 6  # findings listed in the error; the rest are counted


def _code_module(obj: Any) -> str:
    """The module that defines a function, bound method, partial or class."""
    for attr in ("__func__", "func"):
        obj = getattr(obj, attr, obj)
    return getattr(obj, "__module__", None) or ""


def patcher_of(obj: Any) -> str | None:
    """The foreign patcher whose code `obj` is, or None."""
    return FOREIGN_PATCHERS.get(_code_module(obj).split(".")[0])


def _family_names(entry: FamilyEntry, found: dict[str, str]) -> None:
    """The family's target classes and functions as the modeling modules name them now: a patcher that swapped
    a class in the module (class-level patching) leaves models built before it unmatched by the target name, and
    one that swapped a module function changes every model of the family."""
    for name, kind in KINDS.items():
        spec = getattr(entry.kernels, name)
        if spec is None or not spec.enabled:
            continue
        for target in spec.targets if kind.module_forward else [kind.function_name(spec)]:
            try:
                module, attr = resolve_name(entry, target)
            except RegistryError:
                continue
            value = getattr(module, attr, None)
            if patcher := patcher_of(value):
                found[
                    f"{module.__name__}.{attr} is {_code_module(value)}.{getattr(value, '__qualname__', attr)}"
                ] = patcher


def foreign_patches(plan: Plan, model: nn.Module | None, entry: FamilyEntry) -> list[tuple[str, str]]:
    """(patcher, what) for every attribute the plan would replace that holds a foreign patcher's code, every
    target class that is one, and (on a model) every module whose class comes from one."""
    found: dict[str, str] = {}
    _family_names(entry, found)
    for planned in plan.replacements:
        current = getattr(planned.owner, planned.attribute, None)
        if patcher := patcher_of(current):
            found[f"{planned.target}.{planned.attribute} is {_code_module(current)}'s"] = patcher
        owner_cls = planned.owner if isinstance(planned.owner, type) else type(planned.owner)
        if patcher := patcher_of(owner_cls):
            found[f"{planned.target} is a {owner_cls.__module__}.{owner_cls.__qualname__}"] = patcher
    for name, module in model.named_modules() if model is not None else ():
        if patcher := patcher_of(type(module)):
            found.setdefault(
                f"{name or '(root)'} is a {type(module).__module__}.{type(module).__qualname__}", patcher
            )
    return [(patcher, what) for what, patcher in found.items()]


def refuse_foreign(plan: Plan, model: nn.Module | None, entry: FamilyEntry) -> None:
    """PatchError naming the other patcher and what to do, when the model (or family) is already patched by one."""
    found = foreign_patches(plan, model, entry)
    family = entry.family
    if not found:
        return
    patchers = ", ".join(dict.fromkeys(p for p, _ in found))
    shown = [what for _, what in found[:SHOWN]]
    if len(found) > SHOWN:
        shown.append(f"... and {len(found) - SHOWN} more")
    raise PatchError(
        f"liger_registry: {'the model' if model is not None else f'family {family!r}'} is already patched by "
        f"{patchers}:\n"
        + "\n".join(f"  - {what}" for what in shown)
        + "\nTwo patchers on one model stack kernels neither of them tested, and reverting one leaves the other's "
        "in place. Use one: load the model afresh without the other patcher (no apply_liger_kernel_to_*(), "
        "TrainingArguments(use_liger_kernel=True) only inside liger_registry.integrations.use_liger_kernel_flag(), "
        "no Axolotl/LLaMA-Factory liger plugin) and apply liger_registry to it; or keep the other patcher and "
        "do not apply liger_registry."
    )
