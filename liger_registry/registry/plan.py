"""Plans every replacement a resolved family needs on a model (or its classes) without touching anything."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from liger_registry.forwards import ForwardContext, bind_forward, get_forward
from liger_registry.modules.cross_entropy import fixed_cross_entropy
from liger_registry.modules.glu import ACTIVATIONS, glu_forward
from liger_registry.modules.layer_norm import layer_norm_forward
from liger_registry.modules.rms_norm import rms_norm_forward
from liger_registry.modules.rope import apply_rotary_pos_emb
from liger_registry.registry.resolve import ResolvedConfig
from liger_registry.registry.targets import import_module, resolve_class, resolve_name
from liger_registry.schemas import FamilyEntry

MODULE_KERNELS = {
    "rms_norm": (rms_norm_forward, ("weight_attr", "eps_attr")),
    "layer_norm": (layer_norm_forward, ("eps_attr",)),
    "swiglu": (lambda spec: glu_forward(spec, "swiglu"), ("gate", "up", "down")),
    "geglu": (lambda spec: glu_forward(spec, "geglu"), ("gate", "up", "down")),
}


@dataclass
class Planned:
    """One attribute to replace."""

    kernel: str
    scope: str  # instance | class | module
    owner: Any
    attribute: str
    replacement: Any
    target: str


@dataclass
class Plan:
    replacements: list[Planned] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _spec_attrs(spec: Any, names: tuple[str, ...]) -> list[str]:
    return [getattr(spec, n) for n in names]


def _activation_problem(kernel: str, config: Any) -> str | None:
    act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    if config is None or act is None or act in ACTIVATIONS[kernel]:
        return None
    return f"{kernel}: the config's activation is {act!r}; the kernel computes {ACTIVATIONS[kernel][0]}"


def _module_kernel(plan: Plan, kernel: str, spec: Any, entry: FamilyEntry, model: nn.Module | None, config) -> None:
    make, attrs = MODULE_KERNELS[kernel]
    classes = tuple(resolve_class(entry, t) for t in spec.targets)
    forward = make(spec)
    if kernel in ACTIVATIONS and (problem := _activation_problem(kernel, config)):
        plan.problems.append(problem)
        return
    if model is None:
        plan.replacements += [Planned(kernel, "class", c, "forward", forward, c.__qualname__) for c in classes]
        return
    matched = [(name, m) for name, m in model.named_modules() if isinstance(m, classes)]
    if not matched:
        plan.problems.append(f"{kernel}: no module of class {', '.join(spec.targets)} in the model")
    for name, module in matched:
        missing = [a for a in _spec_attrs(spec, attrs) if not hasattr(module, a)]
        if missing:
            plan.problems.append(f"{kernel}: {name} ({type(module).__name__}) has no attribute {', '.join(missing)}")
            continue
        plan.replacements.append(
            Planned(kernel, "instance", module, "forward", types.MethodType(forward, module), name or "(root)")
        )


def _function_kernel(plan: Plan, kernel: str, spec: Any, entry: FamilyEntry) -> None:
    if kernel == "rope":
        module, attr = resolve_name(entry, spec.function)
        replacement = apply_rotary_pos_emb
    else:
        module, attr = import_module("transformers.loss.loss_utils", entry.family), spec.function
        if not hasattr(module, attr):
            plan.problems.append(f"{kernel}: transformers.loss.loss_utils has no {attr!r}")
            return
        replacement = fixed_cross_entropy
    plan.replacements.append(Planned(kernel, "module", module, attr, replacement, f"{module.__name__}.{attr}"))


def _forward(plan: Plan, entry: FamilyEntry, model: nn.Module | None) -> None:
    cls = resolve_class(entry, entry.causal_lm)
    original = cls.forward
    spec = get_forward(entry.forward)
    if model is not None and not isinstance(model, cls):
        plan.problems.append(
            f"fused_linear_cross_entropy: the model is a {type(model).__name__}, not a {entry.causal_lm}: "
            "no head to fuse (pass fused_linear_cross_entropy=False to patch only the decoder kernels)"
        )
        return
    module = import_module(entry.module, entry.family)
    bound = bind_forward(spec.fn, ForwardContext(entry, original, module))
    if model is None:
        plan.replacements.append(Planned("fused_linear_cross_entropy", "class", cls, "forward", bound, cls.__qualname__))
    else:
        method = types.MethodType(bound, model)
        plan.replacements.append(Planned("fused_linear_cross_entropy", "instance", model, "forward", method, "(root)"))


def make_plan(resolved: ResolvedConfig, model: nn.Module | None) -> Plan:
    """Replacements for `model`, or for the family's classes when model is None."""
    entry, plan = resolved.entry, Plan()
    config = getattr(model, "config", None)
    if config is not None and entry.head.text_config_attr:
        config = getattr(config, entry.head.text_config_attr, config)
    for kernel, spec in entry.kernels:
        if spec is None:
            continue
        if not spec.enabled:
            plan.skipped[kernel] = spec.reason or f"off ({resolved.source(f'kernels.{kernel}.enabled')})"
        elif kernel in MODULE_KERNELS:
            _module_kernel(plan, kernel, spec, entry, model, config)
        else:
            _function_kernel(plan, kernel, spec, entry)
    if entry.flce.enabled:
        _forward(plan, entry, model)
    else:
        plan.skipped["fused_linear_cross_entropy"] = entry.flce.reason or "off"
    return plan
