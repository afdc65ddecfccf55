"""Pydantic models of every YAML file the registry reads (torch-free)."""

from liger_registry.schemas.family import FamilyEntry, FlceSpec, HeadSpec, JsdSpec, SkipLogitsMode
from liger_registry.schemas.kernel_kinds import KERNEL_NAMES, KINDS, KernelKind, KernelsPatch, KernelsSpec
from liger_registry.schemas.kernels import (
    AddRmsNormSpec,
    CrossEntropySpec,
    GluSpec,
    LayerNormSpec,
    MoeExpertsSpec,
    RmsNormSpec,
    RopeSpec,
)
from liger_registry.schemas.overrides import LIGER_KEYS, OVERRIDE_PATHS, Overrides
from liger_registry.schemas.policy import PolicyFile

__all__ = [
    "KERNEL_NAMES",
    "KINDS",
    "LIGER_KEYS",
    "OVERRIDE_PATHS",
    "AddRmsNormSpec",
    "CrossEntropySpec",
    "FamilyEntry",
    "FlceSpec",
    "GluSpec",
    "HeadSpec",
    "JsdSpec",
    "KernelKind",
    "KernelsPatch",
    "KernelsSpec",
    "LayerNormSpec",
    "MoeExpertsSpec",
    "Overrides",
    "PolicyFile",
    "RmsNormSpec",
    "RopeSpec",
    "SkipLogitsMode",
]
