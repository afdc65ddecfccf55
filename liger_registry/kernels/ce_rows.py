"""The cross-entropy row kernel of a backend: ``ce_torch.ce_rows_torch`` or ``triton_ce.ce_rows_triton``."""

from __future__ import annotations

from collections.abc import Callable

from .ce_torch import ce_rows_torch
from .triton_ce import ce_rows_triton, make_scales


def ce_rows_for(backend: str) -> Callable:
    """The row kernel for an already decided backend (``"triton"`` or ``"torch"``)."""
    return ce_rows_triton if backend == "triton" else ce_rows_torch


def row_scales(backend: str, ce_scale, z_scale, class_weights, device) -> dict:
    """Extra keyword of the Triton row kernel: its gradient scales packed once per call, not once per chunk."""
    if backend != "triton":
        return {}
    return {"scales": make_scales(ce_scale, z_scale, class_weights, device)}
