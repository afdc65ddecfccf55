"""Coming from liger-kernel: its entry points, loss modules and functional names, over liger_registry.

`apply_liger_kernel_to_<type>(...)` for each model type the reference library serves (its signatures, one table
in `entry_points`), `apply_liger_kernel_to(model_or_model_type, **switches)` (also under the reference's names `_apply_liger_kernel`
and `_apply_liger_kernel_to_instance`), `AutoLigerKernelForCausalLM`,
`LigerCrossEntropyLoss`, `LigerFusedLinearCrossEntropyLoss` and `liger_cross_entropy`,
`liger_fused_linear_cross_entropy`, `liger_swiglu`, `liger_geglu`, `liger_layer_norm`. liger-kernel itself is never
imported. The names load on first use; the README's "Coming from liger-kernel" maps every entry point.
"""

from __future__ import annotations

import importlib

from liger_registry.compat.entry_points import (
    FUNCTIONS,
    MODEL_TYPE_TO_APPLY_LIGER_FN,
    _apply_liger_kernel,
    _apply_liger_kernel_to_instance,
    apply_liger_kernel_to,
)

_LAZY = {
    "AutoLigerKernelForCausalLM": "auto_model",
    "LigerCrossEntropyLoss": "losses",
    "LigerFusedLinearCrossEntropyLoss": "losses",
    "liger_cross_entropy": "losses",
    "liger_fused_linear_cross_entropy": "losses",
    "liger_swiglu": "losses",
    "liger_geglu": "losses",
    "liger_layer_norm": "losses",
}

__all__ = [
    "MODEL_TYPE_TO_APPLY_LIGER_FN",
    "_apply_liger_kernel",
    "_apply_liger_kernel_to_instance",
    "apply_liger_kernel_to",
    *_LAZY,
    *FUNCTIONS,
]


def __getattr__(name: str):
    if name in FUNCTIONS:
        return FUNCTIONS[name]
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
