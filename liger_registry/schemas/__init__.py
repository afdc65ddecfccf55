"""Pydantic models of every YAML file the registry reads."""

from liger_registry.schemas.family import FamilyEntry, FlceSpec, HeadSpec, JsdSpec, SkipLogitsMode
from liger_registry.schemas.kernels import (
    KERNEL_NAMES,
    CrossEntropySpec,
    GluSpec,
    KernelsSpec,
    LayerNormSpec,
    RmsNormSpec,
    RopeSpec,
)
from liger_registry.schemas.policy import PolicyFile

__all__ = [
    "KERNEL_NAMES",
    "CrossEntropySpec",
    "FamilyEntry",
    "FlceSpec",
    "GluSpec",
    "HeadSpec",
    "JsdSpec",
    "KernelsSpec",
    "LayerNormSpec",
    "PolicyFile",
    "RmsNormSpec",
    "RopeSpec",
    "SkipLogitsMode",
]
