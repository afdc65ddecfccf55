"""LLaMA-Factory: `enable_liger_kernel: true` served by liger_registry instead of the liger-kernel package.

Written against LLaMA-Factory's documented hook (0.9.x, `llamafactory.model.model_utils.liger_kernel`):
`apply_liger_kernel(config, model_args, is_trainable, require_logits)`, which `llamafactory.model.loader.
load_model` calls before the model exists (it patches classes by model type), and `patch_model(model, tokenizer,
model_args, is_trainable, add_valuehead)`, which it calls on the loaded model before adapters. liger_registry
patches the model instance, so `install()` decides at the first hook and applies at the second. LLaMA-Factory
0.9.5 does not import beside TRL 1.x (it imports `trl.AutoModelForCausalLMWithValueHead`), so the tests run the
hooks on modules with those documented signatures.

```python
from liger_registry.integrations import llamafactory

llamafactory.install()   # before llamafactory's run_exp / load_model; keep `enable_liger_kernel: true`
```
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from liger_registry.registry.applier import PatchHandle, apply, patch_handle
from liger_registry.registry.configure import unwrap_model
from liger_registry.registry.errors import UnsupportedModelError
from liger_registry.registry.loader import load_registry

LOADER = "llamafactory.model.loader"
PARSER = "llamafactory.hparams.parser"
REQUIREMENT = "liger-kernel"


def apply_liger_kernel(config: Any, model_args: Any, is_trainable: bool, require_logits: bool) -> dict | None:
    """LLaMA-Factory's hook, decided for liger_registry: the `apply` overrides for the model about to be loaded,
    or None when nothing is to be patched (not training, the flag off, or a model type without a family: a
    warning, as LLaMA-Factory does). `require_logits` (stages other than pt and sft: DPO, KTO, PPO, RM read the
    logits) turns FLCE off and always materialises the logits."""
    if not is_trainable or not getattr(model_args, "enable_liger_kernel", False):
        return None
    model_type = getattr(config, "model_type", None)
    try:
        load_registry().family_for(model_type)
    except UnsupportedModelError as exc:
        warnings.warn(f"liger_registry: enable_liger_kernel: {exc}; the model is not patched", stacklevel=2)
        return None
    return {"fused_linear_cross_entropy": False, "skip_logits": "never"} if require_logits else {}


@dataclass
class Installed:
    """The hooks `install` replaced, and the patches applied through them."""

    replaced: list[tuple[ModuleType, str, Any]] = field(default_factory=list)
    handles: list[PatchHandle] = field(default_factory=list)

    def uninstall(self) -> None:
        """Restores LLaMA-Factory's own hooks (the patches stay; `liger_registry.revert` takes them back)."""
        while self.replaced:
            module, name, original = self.replaced.pop()
            setattr(module, name, original)


def _set(installed: Installed, module: ModuleType, name: str, value: Any) -> None:
    installed.replaced.append((module, name, getattr(module, name)))
    setattr(module, name, value)


def _without_liger_requirement(check_version: Callable) -> Callable:
    """LLaMA-Factory's check_version, except that it no longer requires the liger-kernel package."""

    def check(requirement: str, *args: Any, **kwargs: Any) -> Any:
        if requirement.split(">")[0].split("=")[0].split("<")[0].strip() == REQUIREMENT:
            return None
        return check_version(requirement, *args, **kwargs)

    return check


def install(loader: ModuleType | None = None, parser: ModuleType | None = None) -> Installed:
    """Routes LLaMA-Factory's `enable_liger_kernel` to liger_registry: `loader.apply_liger_kernel` decides (see
    `apply_liger_kernel`), `loader.patch_model` applies it to the loaded model, and `parser.check_version` stops
    requiring liger-kernel. Modules default to LLaMA-Factory's own. Returns what to `uninstall()`."""
    loader = loader or importlib.import_module(LOADER)
    installed = Installed()
    pending: list[dict] = []
    patch_model = loader.patch_model

    def hook(config: Any, model_args: Any, is_trainable: bool, require_logits: bool) -> None:
        pending.clear()
        overrides = apply_liger_kernel(config, model_args, is_trainable, require_logits)
        if overrides is not None:
            pending.append(overrides)

    def patch_loaded(model: Any, *args: Any, **kwargs: Any) -> Any:
        result = patch_model(model, *args, **kwargs)
        if pending and patch_handle(unwrap_model(model)) is None:
            installed.handles.append(apply(model, **pending.pop()))
        return result

    _set(installed, loader, "apply_liger_kernel", hook)
    _set(installed, loader, "patch_model", patch_loaded)
    if parser is None:
        try:
            parser = importlib.import_module(PARSER)
        except ImportError:
            parser = None
    if parser is not None and hasattr(parser, "check_version"):
        _set(installed, parser, "check_version", _without_liger_requirement(parser.check_version))
    return installed
