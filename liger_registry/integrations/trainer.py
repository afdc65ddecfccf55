"""Hugging Face Trainer integration: a callback that patches the model Trainer trains (also via model_init),
and a mixin that makes loss-only evaluation skip the logits."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from liger_registry.integrations.liger_config import overrides_from_liger_kernel_config
from liger_registry.integrations.trainer_apply import apply_liger_kernel_config
from liger_registry.integrations.trainer_flag import flag_routed
from liger_registry.registry.applier import PatchHandle, patch_handle
from liger_registry.registry.configure import unwrap_model
from liger_registry.registry.errors import RegistryError


class LigerRegistryCallback(TrainerCallback):
    """Applies the registry to the model the Trainer holds, once, before its first forward.

    With `Trainer(model=...)` applying before building the Trainer is enough and this callback is not needed.
    With `Trainer(model_init=...)` the Trainer builds a fresh model in `train()`: this callback patches it at
    `on_train_begin` (and the first model at `on_init_end`, for `evaluate()` without training). Wrappers (PEFT,
    DDP, FSDP1, torch.compile) are looked through. Options are those of `liger_registry.apply`, plus
    `liger_kernel_config`, the dict users pass to TrainingArguments, translated to overrides. The Trainer's own
    `args.liger_kernel_config` is read too (keys given to the callback win); `args.use_liger_kernel=True` is
    refused unless training runs inside `use_liger_kernel_flag()` (else Trainer would apply liger-kernel too).
    A model already patched keeps its patch when it agrees with every key asked, else a PatchError names the
    difference (the rule of `use_liger_kernel_flag`). An evaluation with `prediction_loss_only=False` on a model
    patched with skip_logits 'labels' gets a warning after its first batch: compute_metrics would get no logits.
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
        self.args_config: dict[str, Any] = {}
        self.handles: list[PatchHandle] = []
        self.warned_predictions = False

    def read_args(self, args: Any) -> None:
        """Takes the Trainer's own `liger_kernel_config` (the callback's own keys win) and refuses
        `use_liger_kernel=True` unless it is routed to liger_registry."""
        if getattr(args, "use_liger_kernel", False) and not flag_routed():
            raise RegistryError(
                "TrainingArguments(use_liger_kernel=True) with LigerRegistryCallback: Trainer.train() would also "
                "apply the liger-kernel package (an ImportError without it; with it, its patches over "
                "liger_registry's)",
                [
                    "set use_liger_kernel=False: this callback reads args.liger_kernel_config itself",
                    "or build and train the Trainer inside `with liger_registry.integrations."
                    "use_liger_kernel_flag():`, which routes the flag to liger_registry",
                ],
            )
        config = dict(getattr(args, "liger_kernel_config", None) or {})
        overrides_from_liger_kernel_config(config)
        self.args_config = config

    def patch(self, model: Any) -> PatchHandle | None:
        if model is None:
            return None
        handle, installed = apply_liger_kernel_config(
            model,
            {**self.args_config, **self.liger_kernel_config},
            policy=self.policy,
            strict=self.strict,
            overrides=self.overrides,
            source="LigerRegistryCallback",
        )
        if installed:
            self.handles.append(handle)
        return handle

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self.read_args(args)
        self.patch(model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.read_args(args)
        self.patch(model)

    def on_prediction_step(self, args, state, control, model=None, **kwargs):
        # After the first batch, before compute_metrics runs on what the evaluation collected
        if args.prediction_loss_only or self.warned_predictions:
            return
        if message := predictions_dropped(model):
            warnings.warn(message, stacklevel=2)
            self.warned_predictions = True

    def revert(self) -> None:
        """Take back every patch this callback installed."""
        while self.handles:
            self.handles.pop().revert()


def predictions_dropped(model: Any) -> str | None:
    """The warning for an evaluation asking for predictions of `model`, when its patch drops the logits of every
    forward with labels (skip_logits 'labels'); None otherwise."""
    handle = patch_handle(unwrap_model(model)) if model is not None else None
    if handle is None or handle.report.config.entry.skip_logits != "labels":
        return None
    return (
        f"liger_registry: skip_logits='labels' (set by {handle.report.config.source('skip_logits')}): a forward "
        "with labels returns no logits, so an evaluation that asks for predictions (compute_metrics with "
        "prediction_loss_only=False, or predict()) gets an empty tuple. Apply with skip_logits='auto' for logits "
        "in evaluation (none in training), or set prediction_loss_only=True for a loss-only evaluation."
    )


class LossOnlyEvalMixin:
    """Mix into a Trainer subclass: evaluation with `prediction_loss_only` computes the loss with fused linear
    cross entropy and never materialises the logits.

    Trainer itself passes `skip_logits=True` only when `use_liger_kernel` is set (it needs the liger-kernel
    package); this does the same for a model patched by liger_registry. Alternatively, without a subclass,
    `apply(model, skip_logits="labels")` skips the logits whenever labels are given (then `compute_metrics`
    gets no logits; this mixin and `LigerRegistryCallback` warn when an evaluation asks for predictions then).
    """

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        labelled = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        if not prediction_loss_only and labelled and "skip_logits" not in inputs:
            if message := predictions_dropped(model):
                warnings.warn(message, stacklevel=2)
        if (
            prediction_loss_only
            and labelled
            and "skip_logits" not in inputs
            and patch_handle(unwrap_model(model))
        ):
            inputs = {**inputs, "skip_logits": True}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
