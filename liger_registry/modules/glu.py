"""Gated-MLP module forwards (SwiGLU, GeGLU): the projections stay, the activation-times-up is fused."""

from __future__ import annotations

from liger_registry import kernels
from liger_registry.schemas import GluSpec

ACTIVATIONS = {"swiglu": ("silu", "swish"), "geglu": ("gelu_pytorch_tanh", "gelu_tanh")}


def glu_forward(spec: GluSpec, kind: str):
    fused = {"swiglu": kernels.swiglu, "geglu": kernels.geglu}[kind]
    gate, up, down = spec.gate, spec.up, spec.down

    def forward(self, x):
        return getattr(self, down)(fused(getattr(self, gate)(x), getattr(self, up)(x)))

    return forward
