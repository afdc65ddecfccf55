"""Family entries, their loader, layering, target resolution and the one generic applier."""

from liger_registry.registry.applier import PatchHandle, apply, patch_handle, patched, revert
from liger_registry.registry.errors import PatchError, RegistryError, UnsupportedModelError
from liger_registry.registry.explain import Explanation, explain
from liger_registry.registry.loader import Registry, load_policy, load_registry
from liger_registry.registry.report import PatchReport, Replacement
from liger_registry.registry.resolve import ResolvedConfig

__all__ = [
    "Explanation",
    "PatchError",
    "PatchHandle",
    "PatchReport",
    "Registry",
    "RegistryError",
    "Replacement",
    "ResolvedConfig",
    "UnsupportedModelError",
    "apply",
    "explain",
    "load_policy",
    "load_registry",
    "patch_handle",
    "patched",
    "revert",
]
