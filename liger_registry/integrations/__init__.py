"""Integrations with the training stack: HF Trainer and TRL, PEFT, torch.compile, FSDP/DDP (see docs/integrations.md)."""

from liger_registry.integrations.liger_config import LIGER_KEYS, overrides_from_liger_kernel_config

__all__ = [
    "LIGER_KEYS",
    "LigerRegistryCallback",
    "LossOnlyEvalMixin",
    "overrides_from_liger_kernel_config",
    "use_liger_kernel_flag",
]

_LAZY = {
    "LigerRegistryCallback": "trainer",
    "LossOnlyEvalMixin": "trainer",
    "use_liger_kernel_flag": "trainer_flag",
}


def __getattr__(name: str):
    # transformers' Trainer machinery is imported only when the Trainer integration is used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"liger_registry.integrations.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
