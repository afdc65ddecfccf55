"""transformers' kernel mapping (`use_kernels=True`, `KernelConfig`) served by liger_registry's layers from a
local `kernels` repository, offline: ``from_pretrained(path, use_kernels=True, kernel_config=kernel_config())``.

The layers replace the forwards of what transformers declares as "RMSNorm" and "rotary_pos_emb" with the kernel
our family entries install there. See docs/integrations.md, "transformers' kernel mapping".
"""

from __future__ import annotations

import importlib

from liger_registry.integrations.hub_kernels.repository import repository_path, write_repository

__all__ = [
    "DEVICES",
    "LAYERS",
    "LigerRegistryKernelConfig",
    "kernel_config",
    "kernel_mapping",
    "kernelized_layers",
    "repository_path",
    "require_kernels",
    "write_repository",
]

_LAZY = {
    "DEVICES": "config",
    "LAYERS": "config",
    "LigerRegistryKernelConfig": "config",
    "kernel_config": "config",
    "kernel_mapping": "config",
    "require_kernels": "config",
    "kernelized_layers": "report",
}


def __getattr__(name: str):
    # torch and transformers load only when a config, a mapping or a report is asked for
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
