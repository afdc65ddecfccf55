"""liger_registry: declarative installation of Triton training kernels into Hugging Face causal LMs.

The public names load on first use (PEP 562): `liger_registry.schemas`, `explain` and the YAML checks import
without torch; `apply` and the kernels bring it in.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_FROM_REGISTRY = (
    "Explanation",
    "PatchError",
    "PatchHandle",
    "PatchReport",
    "Registry",
    "RegistryError",
    "RegistryWarning",
    "UnsupportedModelError",
    "apply",
    "explain",
    "load_registry",
    "model_type_of",
    "patch_handle",
    "patched",
    "revert",
    "unwrap_model",
)

__all__ = list(_FROM_REGISTRY)


def __getattr__(name: str):
    if name not in _FROM_REGISTRY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("liger_registry.registry"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
