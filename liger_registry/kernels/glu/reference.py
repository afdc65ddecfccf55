"""Gated activations and relu² in PyTorch: the twin of the Triton kernels.

* ``swiglu_torch`` / ``geglu_torch`` / ``glu_fused_torch`` / ``swiglu_clamped_torch`` / ``swiglu_limited_torch``
  / ``relu_squared_torch``: the CPU path and the tests' reference; each computes what the family code computes,
  op for op (bit-equal on CPU).
* ``glu_bwd_torch``: the explicit GLU backward the op's torch branch runs (autograd does not record inside a
  custom op's implementation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _scaled(x: torch.Tensor, multiplier: float) -> torch.Tensor:
    """``x * multiplier`` in x's dtype (FalconH1MLP's eager multiply); 1.0 leaves x as it is."""
    return x if multiplier == 1.0 else x * multiplier


def swiglu_torch(
    gate: torch.Tensor, up: torch.Tensor, gate_multiplier: float = 1.0, down_multiplier: float = 1.0
) -> torch.Tensor:
    """``silu(gate) * up``, the activation rounded to the gate's dtype before the multiply (as ``LlamaMLP``); with
    multipliers ``silu(gate * gate_multiplier) * up * down_multiplier``, each multiply in the tensors' dtype (as
    ``FalconH1MLP`` scales its gate; it scales the down projection's output, which commutes with it in exact
    arithmetic)."""
    return _scaled(F.silu(_scaled(gate, gate_multiplier)) * up, down_multiplier)


def geglu_torch(
    gate: torch.Tensor, up: torch.Tensor, gate_multiplier: float = 1.0, down_multiplier: float = 1.0
) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up``, rounded as :func:`swiglu_torch` (as ``GemmaMLP``); multipliers as
    :func:`swiglu_torch`."""
    return _scaled(F.gelu(_scaled(gate, gate_multiplier), approximate="tanh") * up, down_multiplier)


def glu_bwd_torch(dc, gate, up, kind: int, gate_multiplier: float = 1.0, down_multiplier: float = 1.0):
    gate = _scaled(gate, gate_multiplier)  # rounded as the forward rounds it
    a, b, d = gate.float(), up.float(), dc.float() * down_multiplier
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
    return (d * b * dact * gate_multiplier).to(gate.dtype), (d * act.float()).to(up.dtype)


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


def swiglu_limited_torch(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """DeepSeek-V4's experts gate: ``silu(gate) * up`` over a ``[gate | up]`` split, the gate clamped above at
    ``limit``, up clamped to ``[-limit, limit]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def relu_squared_torch(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))
