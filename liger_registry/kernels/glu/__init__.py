"""GLU kernels: SwiGLU / GeGLU, the same over a fused gate_up, GPT-OSS's clamped SwiGLU, and relu².

* :func:`swiglu` / :func:`geglu` ``(gate, up)``: ``act(gate * gate_multiplier) * up * down_multiplier``.
* :func:`glu_fused` ``(gate_up, kind)``: ``gate, up = gate_up.chunk(2, -1)``; ``up * act(gate)`` with act silu
  (``swiglu``) or tanh-gelu (``geglu``): phi3 / glm / glm4 ``MLP.forward``, the gate is the first half.
* :func:`swiglu_clamped` ``(gate_up, limit, alpha)``: GPT-OSS's ``GptOssExperts._apply_gate``: gate and up
  interleaved (``gate_up[..., ::2]``, ``gate_up[..., 1::2]``), ``gate.clamp(max=limit)``,
  ``up.clamp(-limit, limit)``, ``(up + 1) * gate * sigmoid(alpha * gate)``.
* :func:`relu_squared` ``(x)``: ``relu(x) ** 2``, nemotron's ``ACT2FN["relu2"]`` (``ReLUSquaredActivation``).
* Each validates its arguments, then runs the backend its registered Op (``op``) decides.
"""

from __future__ import annotations

import math

import torch

from .op import GEGLU, GLU_FUSED, RELU_SQUARED, SWIGLU, SWIGLU_CLAMPED

GLU_KINDS = ("swiglu", "geglu")


def _check_gate_up(gate_up: torch.Tensor, what: str) -> None:
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(
            f"{what}: the last dim of gate_up must be even (2 * intermediate), got {tuple(gate_up.shape)}"
        )


def _multiplier(what: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what}: {name} must be a finite number, got {value!r}")
    return float(value)


def _glu_args(what: str, gate: torch.Tensor, up: torch.Tensor, gate_multiplier, down_multiplier) -> tuple:
    if gate.shape != up.shape:
        raise ValueError(f"{what}: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    return (
        gate,
        up,
        _multiplier(what, "gate_multiplier", gate_multiplier),
        _multiplier(what, "down_multiplier", down_multiplier),
    )


def _run(op, args: tuple, in_place_backward: bool) -> torch.Tensor:
    backend, _ = op.decide(*args)
    if backend == "triton":
        return op.triton_impl(*args, in_place_backward=in_place_backward)
    return op.torch_impl(*args)


def swiglu(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    gate_multiplier: float = 1.0,
    down_multiplier: float = 1.0,
    in_place_backward: bool = False,
) -> torch.Tensor:
    """``silu(gate * gate_multiplier) * up * down_multiplier``; each multiply rounds to the tensors' dtype as an
    eager one does (Falcon-H1's ``mlp_multipliers``; ``FalconH1MLP`` applies the down multiplier to the down
    projection's output, which a drop-in does after the projection to keep its rounding and bias).

    ``in_place_backward=True`` lets the Triton backward write the gradients over ``gate`` and ``up`` (saves two
    buffers of their size at the backward). Off by default: only safe when nothing reads ``gate`` or ``up`` after
    the backward (an MLP's projections, made for this call alone)."""
    args = _glu_args("swiglu", gate, up, gate_multiplier, down_multiplier)
    return _run(SWIGLU, args, in_place_backward)


def geglu(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    gate_multiplier: float = 1.0,
    down_multiplier: float = 1.0,
    in_place_backward: bool = False,
) -> torch.Tensor:
    """``gelu(gate * gate_multiplier, approximate="tanh") * up * down_multiplier``, rounded as :func:`swiglu`;
    ``in_place_backward`` as there."""
    args = _glu_args("geglu", gate, up, gate_multiplier, down_multiplier)
    return _run(GEGLU, args, in_place_backward)


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


__all__ = ["GLU_KINDS", "geglu", "glu_fused", "relu_squared", "swiglu", "swiglu_clamped"]
