"""Axolotl plugin: `plugins: [liger_registry.integrations.axolotl.LigerRegistryPlugin]` installs liger_registry
from Axolotl's own `liger_*` config keys, in place of Axolotl's liger-kernel plugin.

Written against Axolotl's documented plugin interface (axolotl.integrations.base.BasePlugin, 0.19):
`get_input_args()` names a pydantic model Axolotl merges into its config schema, `pre_model_load(cfg)` runs
before the model is built, `post_model_build(cfg, model)` after it is built and before adapters, and
`post_model_load(cfg, model)` after adapters. Axolotl is not a dependency: without it the class derives from
`object` and keeps the same methods (the tests run it that way and, where Axolotl imports, through its own
plugin loader).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, model_validator

from liger_registry.integrations.liger_config import overrides_from_liger_kernel_config
from liger_registry.registry.applier import PatchHandle, apply, patch_handle
from liger_registry.registry.configure import model_type_of, unwrap_model
from liger_registry.registry.errors import RegistryError
from liger_registry.registry.family_switches import lacks
from liger_registry.registry.loader import load_registry

try:
    from axolotl.integrations.base import BasePlugin
except ImportError:  # Axolotl not installed: the documented interface, duck-typed
    BasePlugin = object

# Axolotl's key -> the liger_kernel_config keys it switches (the GLU key: whichever gated MLP the family has)
AXOLOTL_KEYS: dict[str, tuple[str, ...]] = {
    "liger_rope": ("rope",),
    "liger_rms_norm": ("rms_norm",),
    "liger_glu_activation": ("swiglu", "geglu"),
    "liger_layer_norm": ("layer_norm",),
    "liger_cross_entropy": ("cross_entropy",),
    "liger_fused_linear_cross_entropy": ("fused_linear_cross_entropy",),
}
TOKEN_SCALING = "liger_use_token_scaling"


class LigerRegistryArgs(BaseModel):
    """Axolotl's `liger_*` keys (merged into Axolotl's config schema). As in Axolotl, a kernel is installed only
    when its key is true; unset or false keeps the model's own code."""

    liger_rope: bool | None = None
    liger_rms_norm: bool | None = None
    liger_glu_activation: bool | None = None
    liger_layer_norm: bool | None = None
    liger_cross_entropy: bool | None = None
    liger_fused_linear_cross_entropy: bool | None = None
    liger_use_token_scaling: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _consistent(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            check_keys(data)
        return data


def _get(cfg: Any, key: str) -> Any:
    return cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)


def check_keys(cfg: Any) -> None:
    """The combinations Axolotl itself rejects."""
    problems = []
    if _get(cfg, TOKEN_SCALING) and not _get(cfg, "liger_fused_linear_cross_entropy"):
        problems.append(f"{TOKEN_SCALING}: true requires liger_fused_linear_cross_entropy: true")
    if _get(cfg, "liger_cross_entropy") and _get(cfg, "liger_fused_linear_cross_entropy"):
        problems.append("set one of liger_cross_entropy and liger_fused_linear_cross_entropy, not both")
    bad = [k for k in (*AXOLOTL_KEYS, TOKEN_SCALING) if _get(cfg, k) not in (None, True, False)]
    problems += [f"{k}: expected true or false, got {_get(cfg, k)!r}" for k in bad]
    if problems:
        raise RegistryError("invalid liger_* keys for liger_registry's Axolotl plugin", problems)


def wanted(cfg: Any) -> bool:
    """Whether the config asks for any kernel."""
    return any(_get(cfg, k) is True for k in AXOLOTL_KEYS)


def overrides_from_axolotl(cfg: Any, model_type: str) -> dict[str, Any]:
    """`apply` overrides from Axolotl's keys for one model type: each kernel on exactly when its key is true."""
    check_keys(cfg)
    entry = load_registry().family_for(model_type).entry
    config: dict[str, bool] = {}
    for key, kernels in AXOLOTL_KEYS.items():
        on = _get(cfg, key) is True
        if on and len(kernels) > 1:  # the GLU key: the family's gated MLP kernels (a warning if it has none)
            declared = [k for k in kernels if getattr(entry.kernels, k) is not None] or list(kernels[:1])
            config.update({k: k in declared for k in kernels})
        else:
            config.update(dict.fromkeys(kernels, on))
    for key in [k for k in config if lacks(entry, k)]:  # as Axolotl, which passes only what the patch takes
        if config.pop(key):
            warnings.warn(f"liger_registry: Axolotl asks for {key}, but {lacks(entry, key)}", stacklevel=2)
    overrides = overrides_from_liger_kernel_config(config, model_type)
    if _get(cfg, TOKEN_SCALING):
        overrides["use_token_scaling"] = True
    return overrides


class LigerRegistryPlugin(BasePlugin):
    """Axolotl plugin installing liger_registry on the model Axolotl builds, from its `liger_*` keys.

    ```yaml
    plugins:
      - liger_registry.integrations.axolotl.LigerRegistryPlugin
    liger_rope: true
    liger_rms_norm: true
    liger_glu_activation: true
    liger_fused_linear_cross_entropy: true
    ```

    Do not list Axolotl's own `axolotl.integrations.liger.LigerPlugin` as well (it reads the same keys and
    patches with liger-kernel; `apply` refuses a model it patched).
    """

    def __init__(self) -> None:
        super().__init__()
        self.handles: list[PatchHandle] = []

    def get_input_args(self) -> str:
        return f"{__name__}.LigerRegistryArgs"

    def pre_model_load(self, cfg: Any) -> None:
        """Bad key combinations and an unsupported model type fail before the model is loaded."""
        check_keys(cfg)
        model_type = _get(cfg, "model_config_type")
        if wanted(cfg) and model_type:
            load_registry().family_for(model_type)

    def post_model_build(self, cfg: Any, model: Any) -> None:
        self.patch(cfg, model)

    def post_model_load(self, cfg: Any, model: Any) -> None:
        # Axolotl versions without post_model_build; after adapters, apply looks through PEFT
        self.patch(cfg, model)

    def patch(self, cfg: Any, model: Any) -> PatchHandle | None:
        if model is None or not wanted(cfg):
            return None
        inner = unwrap_model(model)
        existing = patch_handle(inner)
        if existing is not None:
            return existing
        handle = apply(inner, **overrides_from_axolotl(cfg, model_type_of(inner)))
        self.handles.append(handle)
        return handle
