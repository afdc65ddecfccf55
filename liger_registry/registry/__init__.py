"""Family entries, their loader, layering, target resolution and the one generic applier.

Names load on first use (PEP 562), so the loader, the resolver and `explain` import without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "PatchHandle": "applier",
    "apply": "applier",
    "patch_handle": "applier",
    "patched": "applier",
    "revert": "applier",
    "configure": "configure",
    "model_type_of": "configure",
    "unwrap_model": "configure",
    "PatchError": "errors",
    "RegistryError": "errors",
    "RegistryWarning": "errors",
    "UnsupportedModelError": "errors",
    "Explanation": "explain",
    "explain": "explain",
    "Registry": "loader",
    "load_policy": "loader",
    "load_registry": "loader",
    "PatchReport": "report",
    "Replacement": "report",
    "ResolvedConfig": "resolve",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
