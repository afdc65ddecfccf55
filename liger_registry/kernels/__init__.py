"""Kernels: the public functional API; each op dispatches to Triton (CUDA) or PyTorch (CPU), see ``backend``.

One package per op (``ce``, ``flce``, ``glu``, ``jsd``, ``moe``, ``norm``, ``rl_head``, ``rotary``), each laid out as README.md
in this folder says.
"""

from __future__ import annotations

from .backend import (
    BACKENDS,
    ENV_VAR,
    OPS,
    BackendError,
    Op,
    backend_for,
    decide_backend,
    register,
    requested_backend,
    why_not_triton,
)
from .ce import CrossEntropyOutput, cross_entropy
from .flce import (
    FlceOptions,
    FLCEOutput,
    FlcePlan,
    FusedLinearCrossEntropyFunction,
    flce_chunk_geometry,
    flce_plan,
    fused_linear_cross_entropy,
)
from .glu import geglu, glu_fused, relu_squared, swiglu, swiglu_clamped
from .jsd import FusedLinearJSDFunction, fused_linear_jsd
from .moe import moe_experts
from .norm import add_rms_norm, layer_norm, layer_norm_1p, rms_norm
from .rl_head import RlHeadOutput, fused_linear_logprobs
from .rotary import rope, rope_variant

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "OPS",
    "BackendError",
    "CrossEntropyOutput",
    "FLCEOutput",
    "FlceOptions",
    "FlcePlan",
    "FusedLinearCrossEntropyFunction",
    "FusedLinearJSDFunction",
    "Op",
    "RlHeadOutput",
    "add_rms_norm",
    "backend_for",
    "cross_entropy",
    "decide_backend",
    "flce_chunk_geometry",
    "flce_plan",
    "fused_linear_cross_entropy",
    "fused_linear_jsd",
    "fused_linear_logprobs",
    "geglu",
    "glu_fused",
    "layer_norm",
    "layer_norm_1p",
    "moe_experts",
    "register",
    "relu_squared",
    "requested_backend",
    "rms_norm",
    "rope",
    "rope_variant",
    "swiglu",
    "swiglu_clamped",
    "why_not_triton",
]
