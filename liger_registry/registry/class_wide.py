"""Per-instance settings that a class-wide patch makes void: reported, never dropped without a word.

After ``apply("llama")`` the named classes (and module functions such as rotary embedding) run the kernels for
every model. A later ``apply(model, rms_norm=False)`` cannot turn the kernel off for one instance: its modules
still run the class's patched forward. Such an apply is a problem of the plan (a PatchError, or a warning with
``strict=False``) that names the class-wide patch to revert first.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from liger_registry.registry.errors import RegistryError
from liger_registry.registry.resolve import ResolvedConfig
from liger_registry.registry.targets import resolve_name
from liger_registry.schemas import KINDS


def _disabled(config: ResolvedConfig) -> list[str]:
    kernels = config.entry.kernels
    return [n for n in KINDS if getattr(kernels, n) is not None and not getattr(kernels, n).enabled]


def _function_of(config: ResolvedConfig, name: str) -> tuple[Any, str] | None:
    try:
        return resolve_name(config.entry, KINDS[name].function_name(getattr(config.entry.kernels, name)))
    except RegistryError:
        return None


def class_wide_conflicts(config: ResolvedConfig, model: nn.Module, class_wide: dict[str, Any]) -> list[str]:
    """Kernels this instance turns off that a class-wide patch (`class_wide`: family -> handle) keeps on for it."""
    disabled = _disabled(config)
    if not disabled:
        return []
    module_types = {type(m) for m in model.modules()}
    problems = []
    for family, handle in class_wide.items():
        for applied in getattr(handle, "_applied", ()):
            done, owner = applied.replacement, applied.owner()
            if done.kernel not in disabled or owner is None:
                continue
            if done.scope == "class":
                hit = any(issubclass(t, owner) for t in module_types)
            else:
                hit = _function_of(config, done.kernel) == (owner, applied.attribute)
            if hit:
                problems.append(
                    f"{done.kernel}=off cannot take effect on this model: {done.target} is patched class-wide "
                    f"by apply({family!r}); revert that first, or apply class-wide with the kernel off"
                )
    return problems
