"""PyTorch gated activations (SwiGLU / GeGLU on split or fused gate_up, GPT-OSS's clamped SwiGLU) and relu²: the
production CPU path, the reference of the Triton kernels, and the explicit GLU backward the op's torch branch
runs (autograd does not record inside a custom op's implementation). Each computes what the family code
computes, op for op (bit-equal on CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, the activation rounded to the gate's dtype before the multiply (as ``LlamaMLP``)."""
    return F.silu(gate) * up


def geglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up``, rounded as :func:`swiglu_torch` (as ``GemmaMLP``)."""
    return F.gelu(gate, approximate="tanh") * up


def glu_bwd_torch(dc, gate, up, kind: int):
    a, b, d = gate.float(), up.float(), dc.float()
    if kind == 0:
        sig = torch.sigmoid(a)
        dact = sig * (1 + a * (1 - sig))
        act = F.silu(gate)
    else:
        k = 0.7978845608028654
        t = torch.tanh(k * (a + 0.044715 * a**3))
        dact = 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)
        act = F.gelu(gate, approximate="tanh")
    # d up: the activation as the forward multiplied it, rounded to the gate's dtype
    return (d * b * dact).to(gate.dtype), (d * act.float()).to(up.dtype)


def glu_fused_torch(gate_up: torch.Tensor, kind: str = "swiglu") -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) if kind == "swiglu" else F.gelu(gate, approximate="tanh")
    return up * act


def swiglu_clamped_torch(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


def relu_squared_torch(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))
