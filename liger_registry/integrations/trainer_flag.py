"""`TrainingArguments(use_liger_kernel=True)` served by liger_registry: a block in which Trainer's liger-kernel
hook applies the registry instead of importing the liger-kernel package."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from liger_registry.integrations.trainer_apply import apply_liger_kernel_config
from liger_registry.registry.applier import PatchHandle

# Where transformers (5.17 to 5.24) keeps the hook Trainer.train() calls when `use_liger_kernel` is set:
# defined in integrations.liger, imported by name into trainer.
HOOK_MODULES = ("transformers.integrations.liger", "transformers.trainer")
HOOK = "apply_liger_kernel"


class _RegistryHook:
    """Trainer's `apply_liger_kernel(model, kernel_config)`, applying liger_registry with the translated config."""

    def __init__(self, policy: str | Path | list | None, strict: bool, overrides: dict[str, Any]):
        self.policy, self.strict, self.overrides = policy, strict, overrides
        self.handles: list[PatchHandle] = []

    def __call__(self, model: Any, kernel_config: Mapping[str, Any] | None = None) -> PatchHandle | None:
        handle, installed = apply_liger_kernel_config(
            model,
            kernel_config,
            policy=self.policy,
            strict=self.strict,
            overrides=self.overrides,
            source="TrainingArguments(use_liger_kernel=True, liger_kernel_config=...)",
        )
        if installed:
            self.handles.append(handle)
        return handle


def flag_routed() -> bool:
    """Whether Trainer's `use_liger_kernel` hook is liger_registry's now (inside `use_liger_kernel_flag`)."""
    trainer = importlib.import_module("transformers.trainer")
    return isinstance(getattr(trainer, HOOK, None), _RegistryHook)


@contextlib.contextmanager
def use_liger_kernel_flag(
    *, policy: str | Path | list | None = None, strict: bool = True, **overrides: Any
) -> Iterator[list[PatchHandle]]:
    """Inside the block, `Trainer.train()` with `TrainingArguments(use_liger_kernel=True, liger_kernel_config=...)`
    applies liger_registry (the config translated by `overrides_from_liger_kernel_config`, then `overrides`)
    instead of the liger-kernel package, which need not be installed. A model already patched keeps its patch
    when it agrees with every key the config names (and with `policy` and `overrides`); a key it has otherwise is
    a PatchError naming the difference (revert first to re-apply). A model type without a family is an
    UnsupportedModelError, or with `strict=False` a warning, and the model trains unpatched.

    Yields the list of handles it installs; the patches stay after the block (`liger_registry.revert` takes them
    back); the block only restores Trainer's own hook. Train inside the block: Trainer calls the hook in
    `train()`. For `evaluate()` without training, apply first or add `LigerRegistryCallback`.
    """
    hook = _RegistryHook(policy, strict, dict(overrides))
    modules = [importlib.import_module(name) for name in HOOK_MODULES]
    saved = [(module, vars(module).get(HOOK)) for module in modules]
    for module in modules:
        setattr(module, HOOK, hook)
    try:
        yield hook.handles
    finally:
        for module, original in saved:
            setattr(module, HOOK, original)
