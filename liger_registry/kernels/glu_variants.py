"""Gated activations over a fused gate_up projection (SwiGLU, GeGLU, GPT-OSS's clamped SwiGLU) and relu².

* :func:`glu_fused` ``(gate_up, kind)``: ``gate, up = gate_up.chunk(2, -1)``; ``up * act(gate)`` with act silu
  (``swiglu``) or tanh-gelu (``geglu``): phi3 / glm / glm4 ``MLP.forward``, the gate is the first half.
* :func:`swiglu_clamped` ``(gate_up, limit, alpha)``: GPT-OSS's ``GptOssExperts._apply_gate``: gate and up
  interleaved (``gate_up[..., ::2]``, ``gate_up[..., 1::2]``), ``gate.clamp(max=limit)``,
  ``up.clamp(-limit, limit)``, ``(up + 1) * gate * sigmoid(alpha * gate)``.
* :func:`relu_squared` ``(x)``: ``relu(x) ** 2``, nemotron's ``ACT2FN["relu2"]`` (``ReLUSquaredActivation``).

The PyTorch implementations compute what the family code computes, op for op (bit-equal on CPU); the Triton
kernels read gate and up in place from gate_up (no split copy), compute in fp32 and round where the family's
eager ops round (the activation before the multiply; each op of GPT-OSS's gate; relu² once); their backward
writes one gradient tensor shaped like gate_up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .op import Op, register

try:
    from . import custom_ops_variants as _ops
except ImportError:  # pragma: no cover - no triton: torch only
    _ops = None

GLU_KINDS = ("swiglu", "geglu")


def _check_gate_up(gate_up: torch.Tensor, what: str) -> None:
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(
            f"{what}: the last dim of gate_up must be even (2 * intermediate), got {tuple(gate_up.shape)}"
        )


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


class GateUpFunction(torch.autograd.Function):
    """Triton forward and backward of a gated activation over a fused gate_up tensor (saved for backward)."""

    @staticmethod
    def forward(ctx, gate_up, kind: str, limit: float, alpha: float):
        ctx.save_for_backward(gate_up)
        ctx.args = (kind, limit, alpha)
        return _ops.gate_up_fwd(gate_up, kind, limit, alpha)

    @staticmethod
    def backward(ctx, dout):
        (gate_up,) = ctx.saved_tensors
        dgu = _ops.gate_up_bwd(dout, gate_up, *ctx.args)
        return dgu, None, None, None


class ReluSquaredFunction(torch.autograd.Function):
    """Triton forward and backward of ``relu(x) ** 2``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _ops.relu_squared(x, None)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _ops.relu_squared(x, dy)


def glu_fused_triton(gate_up: torch.Tensor, kind: str = "swiglu") -> torch.Tensor:
    return GateUpFunction.apply(gate_up, kind, 0.0, 0.0)


def swiglu_clamped_triton(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    return GateUpFunction.apply(gate_up, "clamped_swiglu", float(limit), float(alpha))


GLU_FUSED = register(
    Op("glu_fused", torch_impl=glu_fused_torch, triton_impl=glu_fused_triton if _ops else None)
)
SWIGLU_CLAMPED = register(
    Op("swiglu_clamped", torch_impl=swiglu_clamped_torch, triton_impl=swiglu_clamped_triton if _ops else None)
)
RELU_SQUARED = register(
    Op("relu_squared", torch_impl=relu_squared_torch, triton_impl=ReluSquaredFunction.apply if _ops else None)
)


def glu_fused(gate_up: torch.Tensor, kind: str = "swiglu") -> torch.Tensor:
    """``up * act(gate)`` with ``gate, up = gate_up.chunk(2, -1)``; kind ``swiglu`` (silu) or ``geglu``
    (tanh gelu). Result ``[..., I]`` for gate_up ``[..., 2I]``."""
    if kind not in GLU_KINDS:
        raise ValueError(f"glu_fused: kind={kind!r}; expected one of {', '.join(GLU_KINDS)}")
    _check_gate_up(gate_up, "glu_fused")
    return GLU_FUSED(gate_up, kind)


def swiglu_clamped(gate_up: torch.Tensor, limit: float, alpha: float) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU over interleaved (gate, up) pairs of gate_up ``[..., 2I]``; result ``[..., I]``."""
    _check_gate_up(gate_up, "swiglu_clamped")
    return SWIGLU_CLAMPED(gate_up, limit, alpha)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """``relu(x) ** 2`` (nemotron's ``relu2``)."""
    return RELU_SQUARED(x)
