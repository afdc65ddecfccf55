"""Kernels: the public functional API; each op dispatches to Triton (CUDA) or PyTorch (CPU), see ``backend``."""

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
from .ce.op import CrossEntropyOutput
from .ce.op import cross_entropy as cross_entropy
from .flce.api import FLCEOutput, FusedLinearCrossEntropyFunction
from .flce.api import fused_linear_cross_entropy as fused_linear_cross_entropy
from .flce.options import FlceOptions
from .flce.planner import FlcePlan, flce_chunk_geometry, flce_plan
from .glu import geglu, glu_fused, relu_squared, swiglu, swiglu_clamped
from .jsd.api import FusedLinearJSDFunction
from .jsd.api import fused_linear_jsd as fused_linear_jsd
from .moe import moe_experts
from .norm import add_rms_norm, layer_norm, layer_norm_1p, rms_norm
from .rope import rope, rope_variant

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
    "add_rms_norm",
    "backend_for",
    "cross_entropy",
    "decide_backend",
    "flce_chunk_geometry",
    "flce_plan",
    "fused_linear_cross_entropy",
    "fused_linear_jsd",
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
