"""The reference library's `apply_liger_kernel_to_<type>` functions, one table row each, over `liger_registry.apply`.

Each generated function has the reference's signature (parameter names, order, documented defaults), so tools
that read it (`inspect.signature`, kwargs filters) see what they expect. What it does differs on purpose:

- an argument passed turns, as `apply` overrides, our kernels that do what the reference's switch patches for that
  type (`SWITCH_KINDS`, a row's `kinds`): `rope=False` -> `apply(..., rope=False)`, `rms_norm=False` also turns off
  the fused add + norm, qwen3_moe's `swiglu` is our `moe_experts`; a switch that maps to nothing the family has is
  a logged WARNING naming it, never an error (the reference accepts it). An argument left out keeps the family
  entry's choice, which may differ from the reference's default (see the README);
- `model=None` patches the classes of the function's own model type (`apply("<type>")`), as the reference does;
  a model patches that instance only, and must be of a model type the function serves;
- a keyword that is no kernel switch raises; the handle of the patch is returned (revert with it).
"""

from __future__ import annotations

import logging
from typing import Any

import liger_registry
from liger_registry.registry.family_switches import lacks, switch_on_problem
from liger_registry.registry.reference_switches import (
    BY_MODEL_TYPE,
    ENTRY_POINTS,
    SWITCH_KINDS,
    SWITCHES,
    EntryPoint,
)

logger = logging.getLogger(__name__)


def _unexpected(function: str, names: list[str], allowed: tuple[str, ...]) -> TypeError:
    return TypeError(
        f"{function}() got unexpected keyword argument(s) {', '.join(map(repr, names))}; "
        f"the kernel switches it takes: {', '.join(allowed)}"
    )


def check_switches(function: str, switches: dict[str, Any], allowed: tuple[str, ...] = SWITCHES) -> dict:
    """The kernel switches; a name that is not a switch is a TypeError naming them."""
    unknown = [name for name in switches if name not in allowed]
    if unknown:
        raise _unexpected(function, unknown, allowed)
    return dict(switches)


def _nothing_for(entry: EntryPoint | None, family: Any, switch: str) -> str:
    kinds = entry.kinds_of(switch) if entry else SWITCH_KINDS.get(switch, (switch,))
    if not kinds:
        return f"the reference patches nothing with it on {entry.name}"
    return "; ".join(switch_on_problem(family, kind) for kind in kinds)


def to_overrides(function: str, entry: EntryPoint | None, model_type: str, switches: dict[str, Any]) -> dict:
    """`apply` overrides meaning what the reference's switches mean for this type: each switch turns the kinds it
    patches there (EntryPoint.kinds_of) that the family has; one that maps to none of them is a logged WARNING
    naming it (the reference accepts it), never an error."""
    family = liger_registry.load_registry().family_for(model_type).entry
    overrides: dict[str, Any] = {}
    for switch, value in switches.items():
        kinds = entry.kinds_of(switch) if entry else SWITCH_KINDS.get(switch, (switch,))
        ours = [kind for kind in kinds if lacks(family, kind) is None]
        if ours:
            overrides.update(dict.fromkeys(ours, value))
        elif value:
            logger.warning(
                "%s: %s=True installs nothing on family %r: %s",
                function,
                switch,
                family.family,
                _nothing_for(entry, family, switch),
            )
        else:
            logger.info("%s: %s=False: family %r has nothing to switch off", function, switch, family.family)
    return overrides


def _check_model(entry: EntryPoint, model: Any) -> None:
    model_type = liger_registry.model_type_of(model)
    if model_type not in entry.types:
        other = BY_MODEL_TYPE.get(model_type)
        use = other.function_name if other else "liger_registry.compat.apply_liger_kernel_to"
        raise ValueError(
            f"{entry.function_name}(model=...) serves model_type {', '.join(entry.types)}; this model is "
            f"{model_type!r}: use {use}(model=...), or liger_registry.apply(model)"
        )


def run_entry_point(entry: EntryPoint, model: Any, switches: dict[str, Any]):
    """Apply the switches to `model`, or class-wide to the entry's own model type when `model` is None."""
    if model is None:
        return liger_registry.apply(
            entry.name, **to_overrides(entry.function_name, entry, entry.name, switches)
        )
    _check_model(entry, model)
    model_type = liger_registry.model_type_of(model)
    return liger_registry.apply(model, **to_overrides(entry.function_name, entry, model_type, switches))


def make_entry_point(entry: EntryPoint):
    """The `apply_liger_kernel_to_<name>` function of one row: the reference's signature over `apply`."""
    signature = entry.signature()

    def apply_liger_kernel_to_type(*args: Any, **kwargs: Any):
        given = dict(signature.bind(*args, **kwargs).arguments)  # bind: only what the caller passed
        forwarded = given.pop("kwargs", {})
        model = given.pop("model", None)
        switches = {**given, **check_switches(entry.function_name, forwarded)}
        return run_entry_point(entry, model, switches)

    apply_liger_kernel_to_type.__name__ = apply_liger_kernel_to_type.__qualname__ = entry.function_name
    apply_liger_kernel_to_type.__signature__ = signature
    apply_liger_kernel_to_type.__doc__ = (
        f"liger-kernel's {entry.function_name} over liger_registry.apply: each argument passed turns what the "
        "reference's switch patches for this type, one left out keeps the family entry's choice; model=None "
        f"patches model_type {entry.name!r} class-wide. Returns the PatchHandle."
    )
    return apply_liger_kernel_to_type


FUNCTIONS: dict[str, Any] = {e.function_name: make_entry_point(e) for e in ENTRY_POINTS}
MODEL_TYPE_TO_APPLY_LIGER_FN: dict[str, Any] = {
    t: FUNCTIONS[e.function_name] for t, e in BY_MODEL_TYPE.items()
}


def switches_for(
    model_type: str, liger_kwargs: dict[str, Any], function: str = "AutoLigerKernelForCausalLM"
) -> dict:
    """The switches a model type's reference function takes (any switch for a model type the reference does
    not serve), checked: another name is a TypeError, never filtered away (the reference hands it on to
    transformers, which refuses it)."""
    entry = BY_MODEL_TYPE.get(model_type)
    allowed = SWITCHES if entry is None or entry.forwards_kwargs else entry.switches
    return check_switches(function, liger_kwargs, allowed)


def _taken(function: str, model_type: str, switches: dict[str, Any]) -> dict[str, Any]:
    """The switches the type's reference function takes; the reference's generic functions drop the others, and
    so does this, with a logged WARNING naming each (one liger_kernel_config serves every model type)."""
    entry = BY_MODEL_TYPE.get(model_type)
    if entry is None or entry.forwards_kwargs:
        return switches
    for switch in [s for s in switches if s not in entry.switches]:
        logger.warning(
            "%s: %s=%r is not a switch of %s (it takes %s): ignored, as the reference ignores it",
            function,
            switch,
            switches[switch],
            entry.function_name,
            ", ".join(entry.switches),
        )
    return {k: v for k, v in switches.items() if k in entry.switches}


def apply_liger_kernel_to(model_or_model_type: Any, **liger_kwargs: Any):
    """The reference's `_apply_liger_kernel(model_type, **kw)` and `_apply_liger_kernel_to_instance(model, **kw)`
    in one: a model (or a model type, class-wide) and the reference's kernel switches, each meaning what it means
    for the type's reference function. A name that is no switch at all is a TypeError."""
    function = "apply_liger_kernel_to"
    is_type = isinstance(model_or_model_type, str)
    model_type = model_or_model_type if is_type else liger_registry.model_type_of(model_or_model_type)
    switches = _taken(function, model_type, check_switches(function, liger_kwargs))
    overrides = to_overrides(function, BY_MODEL_TYPE.get(model_type), model_type, switches)
    return liger_registry.apply(model_or_model_type, **overrides)


def _apply_liger_kernel(model_type: str, **kwargs: Any):
    """The reference's name for `apply_liger_kernel_to(model_type, **kwargs)` (class-wide)."""
    return apply_liger_kernel_to(model_type, **kwargs)


def _apply_liger_kernel_to_instance(model: Any, **kwargs: Any):
    """The reference's name for `apply_liger_kernel_to(model, **kwargs)`; transformers' Trainer calls it with
    `model=` and the `liger_kernel_config` dict."""
    return apply_liger_kernel_to(model, **kwargs)
