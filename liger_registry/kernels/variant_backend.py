"""Backend choice (Triton or PyTorch) of the kernel variants of issue 12, kept in one function to swap later.

Until these ops are registered in ``op.OPS`` they are unregistered :class:`~.op.Op` objects: the same rule
as the registered ops (``LIGER_REGISTRY_BACKEND``; auto: CUDA tensors run Triton, CPU tensors PyTorch;
forced triton that cannot run raises :class:`~.op.BackendError`).
"""

from __future__ import annotations

import torch

from .op import Op

try:
    import triton  # noqa: F401

    _HAS_TRITON = True
except ImportError:  # pragma: no cover - non-Linux: torch only
    _HAS_TRITON = False

VARIANT_OPS = ("rope_variant", "glu_fused", "swiglu_clamped", "relu_squared", "add_rms_norm")


def _never_called(*args, **kwargs):  # pragma: no cover - the variants call their impls themselves
    raise RuntimeError("variant ops are dispatched by variant_backend, not called through Op")


_OPS = {
    name: Op(name, torch_impl=_never_called, triton_impl=_never_called if _HAS_TRITON else None)
    for name in VARIANT_OPS
}


def variant_backend(op_name: str, *tensors: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"`` for a call of ``op_name`` on these tensors."""
    op = _OPS[op_name]
    if hasattr(op, "decide"):  # the Op of the dispatch refactor (branch ``kernels``) decides with reasons
        return op.decide(*tensors)[0]
    return op.choose(*tensors)
