"""Backend choice of the kernel variants of issue 12: a thin use of the registered ops' :meth:`~.op.Op.decide`."""

from __future__ import annotations

import torch

from .op import OPS

VARIANT_OPS = ("rope_variant", "glu_fused", "swiglu_clamped", "relu_squared", "add_rms_norm")


def variant_backend(op_name: str, *tensors: torch.Tensor) -> str:
    """``"triton"`` or ``"torch"`` for a call of ``op_name`` on these tensors (the registered op's rule)."""
    return OPS[op_name].decide(*tensors)[0]
