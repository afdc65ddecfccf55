"""Gated-MLP module forwards (SwiGLU, GeGLU): the projections stay, the activation-times-up is fused."""

from __future__ import annotations

from collections.abc import Callable

from liger_registry import kernels
from liger_registry.modules.wiring import makes
from liger_registry.schemas import GluSpec


def _glu_forward(spec: GluSpec, fused: Callable) -> Callable:
    gate, up, down = spec.gate, spec.up, spec.down

    def forward(self, x):
        return getattr(self, down)(fused(getattr(self, gate)(x), getattr(self, up)(x)))

    return forward


@makes("swiglu")
def swiglu_forward(spec: GluSpec) -> Callable:
    return _glu_forward(spec, kernels.swiglu)


@makes("geglu")
def geglu_forward(spec: GluSpec) -> Callable:
    return _glu_forward(spec, kernels.geglu)
