"""Hugging Face Trainer integration: a callback that patches the model Trainer trains (also via model_init),
and a mixin that makes loss-only evaluation skip the logits."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from liger_registry.integrations.liger_config import overrides_from_liger_kernel_config
from liger_registry.registry.applier import PatchHandle, apply, patch_handle
from liger_registry.registry.configure import model_type_of, unwrap_model


class LigerRegistryCallback(TrainerCallback):
    """Applies the registry to the model the Trainer holds, once, before its first forward.

    With `Trainer(model=...)` applying before building the Trainer is enough and this callback is not needed.
    With `Trainer(model_init=...)` the Trainer builds a fresh model in `train()`: this callback patches it at
    `on_train_begin` (and the first model at `on_init_end`, for `evaluate()` without training). Wrappers (PEFT,
    DDP, FSDP1, torch.compile) are looked through. Options are those of `liger_registry.apply`, plus
    `liger_kernel_config`, the dict users pass to TrainingArguments, translated to overrides.
    """

    def __init__(
        self,
        *,
        policy: str | Path | list | None = None,
        liger_kernel_config: Mapping[str, Any] | None = None,
        strict: bool = True,
        **overrides: Any,
    ):
        self.policy, self.strict, self.overrides = policy, strict, dict(overrides)
        self.liger_kernel_config = dict(liger_kernel_config or {})
        overrides_from_liger_kernel_config(self.liger_kernel_config)  # bad keys fail here, not mid-training
        self.handles: list[PatchHandle] = []

    def patch(self, model: Any) -> PatchHandle | None:
        if model is None:
            return None
        inner = unwrap_model(model)
        existing = patch_handle(inner)
        if existing is not None:
            return existing
        from_config = overrides_from_liger_kernel_config(self.liger_kernel_config, model_type_of(inner))
        handle = apply(inner, policy=self.policy, strict=self.strict, **{**from_config, **self.overrides})
        self.handles.append(handle)
        return handle

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self.patch(model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.patch(model)

    def revert(self) -> None:
        """Take back every patch this callback installed."""
        while self.handles:
            self.handles.pop().revert()


class LossOnlyEvalMixin:
    """Mix into a Trainer subclass: evaluation with `prediction_loss_only` computes the loss with fused linear
    cross entropy and never materialises the logits.

    Trainer itself passes `skip_logits=True` only when `use_liger_kernel` is set (it needs the liger-kernel
    package); this does the same for a model patched by liger_registry. Alternatively, without a subclass,
    `apply(model, skip_logits="labels")` skips the logits whenever labels are given (then `compute_metrics`
    gets no logits).
    """

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        labelled = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        if (
            prediction_loss_only
            and labelled
            and "skip_logits" not in inputs
            and patch_handle(unwrap_model(model))
        ):
            inputs = {**inputs, "skip_logits": True}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
