"""liger_registry: declarative installation of Triton training kernels into Hugging Face causal LMs."""

from liger_registry.registry import (
    Explanation,
    PatchError,
    PatchHandle,
    PatchReport,
    Registry,
    RegistryError,
    UnsupportedModelError,
    apply,
    explain,
    load_registry,
    patch_handle,
    patched,
    revert,
)

__version__ = "0.1.0"

__all__ = [
    "Explanation",
    "PatchError",
    "PatchHandle",
    "PatchReport",
    "Registry",
    "RegistryError",
    "UnsupportedModelError",
    "apply",
    "explain",
    "load_registry",
    "patch_handle",
    "patched",
    "revert",
]
