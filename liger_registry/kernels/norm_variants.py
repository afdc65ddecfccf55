"""LayerNorm1P (nemotron's ``NemotronLayerNorm1P``): LayerNorm with ``weight + 1`` on the fused LayerNorm kernel.

``weight + 1`` is formed in the weight's dtype, exactly as nemotron does (an offset added in fp32 inside the
kernel would differ from it in the last bit for bf16 weights); it is one [hidden] add, and autograd carries
the weight's gradient through it. Under autocast the inputs are cast as nemotron casts them, then the norm
runs with autocast off.
"""

from __future__ import annotations

import torch

from . import layer_norm


def layer_norm_1p(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """``layer_norm(x, weight + 1, bias, eps)`` on the fused LayerNorm op (Triton on CUDA, torch on CPU)."""
    device_type = x.device.type
    w1 = weight + 1.0
    if not torch.is_autocast_enabled(device_type):
        return layer_norm(x, w1, bias, eps)
    if torch.is_autocast_enabled():  # nemotron tests the CUDA flag, then casts to the device's autocast dtype
        dtype = torch.get_autocast_dtype(device_type)
        x, w1, bias = (t.to(dtype) if t is not None else None for t in (x, w1, bias))
    with torch.autocast(device_type=device_type, enabled=False):
        return layer_norm(x, w1, bias, eps)
