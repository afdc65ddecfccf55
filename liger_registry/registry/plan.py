"""Plans every replacement a resolved family needs on a model (or its classes) without touching anything."""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from liger_registry.attr_path import text_config
from liger_registry.forwards import ForwardContext, bind_forward, get_forward
from liger_registry.modules import wiring
from liger_registry.modules.module_attr import attr_label, has_attr
from liger_registry.registry.errors import RegistryError
from liger_registry.registry.positions import default_positions_forward, has_own_forward
from liger_registry.registry.rebind import calls_function, rebind
from liger_registry.registry.resolve import ResolvedConfig
from liger_registry.registry.subclasses import overriding_modules, subclass_problem
from liger_registry.registry.targets import (
    head_problems,
    import_module,
    moe_problems,
    resolve_class,
    resolve_function,
)
from liger_registry.registry.trl_head import trl_fused_head
from liger_registry.schemas import KINDS, FamilyEntry, KernelKind
from liger_registry.schemas.kernel_kinds import FLCE_KEY

FORWARD = "forward"  # the report's name for the installed causal-LM forward


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


def _activation_problem(kind: KernelKind, spec: Any, config: Any) -> str | None:
    """The config's activation, read through the spec's act_config_attr, must be one the kernel computes."""
    activations = getattr(spec, "activations", kind.activations)
    if not activations or config is None or spec.act_config_attr is None:
        return None
    names = [spec.act_config_attr] if isinstance(spec.act_config_attr, str) else spec.act_config_attr
    attr = next((n for n in names if getattr(config, n, None) is not None), None)
    if attr is None:
        return (
            f"{kind.name}: act_config_attr {spec.act_config_attr!r}: the config ({type(config).__name__}) has no "
            "such attribute, so the activation cannot be checked"
        )
    act = getattr(config, attr)
    if act in activations:
        return None
    return f"{kind.name}: the config's {attr} is {act!r}; the kernel computes {activations[0]}"


def _module_kernel(
    plan: Plan, kind: KernelKind, spec: Any, entry: FamilyEntry, model: nn.Module | None, config
) -> None:
    classes = tuple(resolve_class(entry, t) for t in spec.targets)
    if problem := _activation_problem(kind, spec, config):
        plan.problems.append(problem)
        return
    if lacking := [c.__name__ for c in classes if not callable(getattr(c, kind.method, None))]:
        plan.problems.append(f"{kind.name}: {', '.join(lacking)} has no method {kind.method}")
        return
    check = wiring.check(kind.name)
    if check is not None and (refused := [p for c in classes if (p := check(spec, entry, c, resolve_class))]):
        plan.problems += [f"{kind.name}: {p}" for p in refused]
        return
    forward = wiring.maker(kind.name, spec.variant)(spec)
    if model is None:
        plan.replacements += [
            Planned(kind.name, "class", c, kind.method, forward, c.__qualname__) for c in classes
        ]
        return
    matched = [(name, m) for name, m in model.named_modules() if isinstance(m, classes)]
    if not matched:
        plan.problems.append(f"{kind.name}: no module of class {', '.join(spec.targets)} in the model")
    overriding = overriding_modules(matched, classes, kind.method)
    plan.problems += [f"{kind.name}: {p}" for p in overriding.values()]
    matched = [(name, m) for name, m in matched if name not in overriding]
    for name, module in matched:
        attrs = spec.module_attributes(kind.attributes)
        missing = [attr_label(names) for names in attrs if not has_attr(module, names)]
        if missing:
            plan.problems.append(
                f"{kind.name}: {name} ({type(module).__name__}) has no attribute {', '.join(missing)}"
            )
            continue
        if check is not None and (problem := check(spec, entry, module, resolve_class)):
            plan.problems.append(f"{kind.name}: {name}: {problem}")
            continue
        plan.replacements.append(
            Planned(
                kind.name,
                "instance",
                module,
                kind.method,
                types.MethodType(forward, module),
                name or "(root)",
            )
        )


def _function_kernel(
    plan: Plan, kind: KernelKind, spec: Any, entry: FamilyEntry, model: nn.Module | None
) -> None:
    module, attr = resolve_function(entry, kind.function_name(spec))
    replacement = wiring.maker(kind.name, spec.variant)
    if model is not None and (callers := _callers(model, module, attr, replacement)):
        plan.replacements += [
            Planned(kind.name, "instance", m, "forward", forward, f"{name}.forward({attr})")
            for name, m, forward in callers
        ]
        return
    plan.replacements.append(
        Planned(kind.name, "module", module, attr, replacement, f"{module.__name__}.{attr}")
    )


def _callers(model: nn.Module, module: types.ModuleType, attr: str, replacement: Any) -> list | None:
    """(name, module, forward) for each module of the model whose class's forward calls `module.attr` by name,
    the forward a copy that calls `replacement` instead; None when there are none or one cannot be copied
    (then the function is patched module-wide)."""
    copies: dict[type, Any] = {}
    callers = []
    for name, sub in model.named_modules():
        cls = type(sub)
        if cls not in copies:
            method = vars(cls).get("forward") or getattr(cls, "forward", None)
            copies[cls] = (
                rebind(method, module, attr, replacement) if calls_function(method, module, attr) else False
            )
            if copies[cls]:  # the report names the drop-in, not the copied forward
                copies[cls].__liger_forward__ = replacement
        if copies[cls] is None:
            return None
        if copies[cls]:
            callers.append((name or "(root)", sub, copies[cls]))
    return callers or None


def _forward(plan: Plan, entry: FamilyEntry, model: nn.Module | None) -> None:
    """The causal-LM forward, installed whether FLCE is on or off: it owns skip_logits either way."""
    cls = resolve_class(entry, entry.causal_lm)
    if model is not None and not isinstance(model, cls):
        if entry.flce.enabled:
            plan.problems.append(
                f"{FORWARD}: the model is a {type(model).__name__}, not a {entry.causal_lm}: no head to fuse "
                f"(pass {FLCE_KEY}=False to patch only the decoder kernels)"
            )
        else:
            plan.skipped[FORWARD] = (
                f"the model is a {type(model).__name__}, not a {entry.causal_lm}: no causal-LM head"
            )
        return
    if model is not None and (problem := subclass_problem(type(model), cls, "forward")):
        plan.problems.append(f"{FORWARD}: {problem}")
        return
    if model is not None and (head := trl_fused_head(model)):
        _keep_trl_head(plan, entry, head)
        return
    spec = get_forward(entry.forward)
    config = None if model is None else language_config(model.config, entry)
    if spec.fuses and (problems := head_problems(entry, model, config)):  # a forward that reads the head
        plan.problems += [f"{FORWARD}: {p}" for p in problems]
        return
    if entry.flce.enabled and not spec.fuses:
        plan.problems.append(f"{FORWARD}: {never_fuses(entry.forward)}")
        return
    holders = () if model is None else (model, language_config(model.config, entry))
    if spec.moe and (problems := moe_problems(entry, *holders)):
        plan.problems += [f"{FORWARD}: {p}" for p in problems]
        return
    ctx = ForwardContext(entry, original_forward(cls), import_module(entry.module, entry.family))
    bound = bind_forward(spec.fn, ctx)
    if model is None:
        plan.replacements.append(Planned(FORWARD, "class", cls, "forward", bound, cls.__qualname__))
    else:
        plan.replacements.append(
            Planned(FORWARD, "instance", model, "forward", types.MethodType(bound, model), "(root)")
        )
    if spec.fuses:  # the forwards that call the base model through causal_lm's _base_call
        ctx.takes_default_positions = _default_positions(plan, entry, model)


def _default_positions(plan: Plan, entry: FamilyEntry, model: nn.Module | None) -> Callable | None:
    """The base model's forward that skips the packed-sequence check for default positions (see
    :mod:`liger_registry.forwards.positions`), where its class's forward builds masks from positions: on the
    model's base model, or, patching by model type, class-wide on the base class named after the head
    (``LlamaForCausalLM``: ``LlamaModel``). Returns base model -> whether it takes the keyword (by identity or
    exact class: torch 2.11's dynamo does not see an instance's installed forward), or None."""
    if model is None:
        if "ForCausalLM" not in entry.causal_lm:
            return None
        module = import_module(entry.module, entry.family)
        owner = getattr(module, entry.causal_lm.replace("ForCausalLM", "Model"), None)
        if not (isinstance(owner, type) and issubclass(owner, nn.Module)):
            return None
        forward = default_positions_forward(owner)
        if forward is None:
            return None
        target = f"{owner.__qualname__}.forward(masks of default positions)"
        plan.replacements.append(Planned(FORWARD, "class", owner, "forward", forward, target))
        return lambda base: type(base) is owner
    base = getattr(model, entry.head.base_model, None)
    found = _mask_builder(base, entry.head.base_model) if isinstance(base, nn.Module) else None
    if found is None:
        return None
    builder, path, forward = found
    target = f"{path}.forward(masks of default positions)"
    plan.replacements.append(
        Planned(FORWARD, "instance", builder, "forward", types.MethodType(forward, builder), target)
    )
    ref = weakref.ref(base)
    return lambda called: ref() is called


# Where a multimodal base model keeps its text model; each passes position_ids and its other keywords on to it
TEXT_MODELS = ("language_model", "text_model", "model")


def _mask_builder(module: nn.Module, path: str, depth: int = 3) -> tuple[nn.Module, str, Callable] | None:
    """The module under the base model (itself, or its text model in a multimodal one) whose forward builds the
    masks, its path and its default-positions forward; None when there is none or it holds a forward of its own."""
    if has_own_forward(module):
        return None
    forward = default_positions_forward(type(module))
    if forward is not None:
        return module, path, forward
    for name in TEXT_MODELS if depth > 1 else ():
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return _mask_builder(child, f"{path}.{name}", depth - 1)
    return None


def _keep_trl_head(plan: Plan, entry: FamilyEntry, head: str) -> None:
    """The model's forward is TRL's fused LM head (its trainer installed it): TRL computes the loss through it
    without logits, on the decoder that the other kernels patch; replacing it would break TRL's training step."""
    where = f"the model's forward is TRL's fused LM head ({head}), kept: it computes the loss without logits"
    if entry.flce.enabled:
        plan.problems.append(
            f"{FORWARD}: {where}; apply before building the TRL trainer (TRL then wraps the patched forward), "
            f"or pass {FLCE_KEY}=False to install the decoder kernels under TRL's head"
        )
    else:
        plan.skipped[FORWARD] = where


def original_forward(cls: type) -> Any:
    """The class's forward as transformers defines it, also while a class-wide apply has replaced it."""
    context = getattr(cls.forward, "__liger_context__", None)
    return cls.forward if context is None else context.original


def never_fuses(forward: str) -> str:
    return (
        f"forward {forward!r} never fuses the loss; set flce.enabled: false in the family (with a reason) "
        f"or pass {FLCE_KEY}=False"
    )


def _kernel(plan: Plan, resolved: ResolvedConfig, kind: KernelKind, spec: Any, model, config) -> None:
    if not spec.enabled:
        plan.skipped[kind.name] = spec.reason or f"off ({resolved.source(f'kernels.{kind.name}.enabled')})"
    elif kind.module_forward:
        _module_kernel(plan, kind, spec, resolved.entry, model, config)
    else:
        _function_kernel(plan, kind, spec, resolved.entry, model)


def language_config(config: Any, entry: FamilyEntry) -> Any:
    """The config of the language model: the head's text_config_attr, else transformers' get_text_config()."""
    if config is None:
        return None
    return text_config(config, entry.head.text_config_attr if entry.head else None)


def make_plan(resolved: ResolvedConfig, model: nn.Module | None) -> Plan:
    """Replacements for `model`, or for the family's classes when model is None.

    A name that does not resolve in the installed transformers (a renamed or removed class or function) is a
    problem of its kernel, like a target that matches nothing: `strict=False` makes it a warning.
    """
    entry, plan = resolved.entry, Plan(skipped=dict(resolved.noops))
    config = language_config(getattr(model, "config", None), entry)
    for name, kind in KINDS.items():
        spec = getattr(entry.kernels, name)
        if spec is None:
            continue
        try:
            _kernel(plan, resolved, kind, spec, model, config)
        except RegistryError as exc:
            plan.problems.append(f"{name}: {exc}")
    if entry.head is None:
        plan.skipped[FORWARD] = f"no causal-LM head: {entry.causal_lm} is a bare language model"
        return plan
    try:
        _forward(plan, entry, model)
    except RegistryError as exc:
        plan.problems.append(f"{FORWARD}: {exc}")
    if not entry.flce.enabled:
        plan.skipped[FLCE_KEY] = entry.flce.reason or f"off ({resolved.source('flce.enabled')})"
    return plan
