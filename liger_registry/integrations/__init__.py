"""Integrations with the training stack: HF Trainer and TRL, PEFT, torch.compile, FSDP/DDP (see docs/integrations.md)."""

from liger_registry.integrations.liger_config import LIGER_KEYS, overrides_from_liger_kernel_config

__all__ = ["LIGER_KEYS", "LigerRegistryCallback", "LossOnlyEvalMixin", "overrides_from_liger_kernel_config"]


def __getattr__(name: str):
    # transformers' Trainer machinery is imported only when the Trainer integration is used
    if name in ("LigerRegistryCallback", "LossOnlyEvalMixin"):
        from liger_registry.integrations import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
