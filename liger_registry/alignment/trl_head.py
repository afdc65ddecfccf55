"""Our RL head behind TRL's fused-LM-head contract: :func:`add_fused_lm_head` (the signature and output of TRL
1.16's ``trl.trainer.utils.add_fused_lm_head``) and :func:`use_for_trl_fused_head`, the switch that makes TRL's
trainers (``GRPOTrainer``, ``RLOOTrainer``, ...) install it instead of TRL's own head.

* A model given the head answers ``model(..., labels=labels, fused_lm_head=True)`` with a
  :class:`FusedHeadOutput`: per-token ``log_probs`` of each next-token label and, as asked in ``outputs``,
  ``entropy``, ``log_sum_sq_probs``, ``mean_logits``, ``is_top1``; ``[B, T - 1]`` (``[B, T]`` with pre-shifted
  ``shift_labels``), zero where the label is -100; ``loss`` the mean negative log-prob over the counted tokens
  (or summed over ``num_items_in_batch``), plus the MoE load-balancing loss when router logits are asked for.
  Without ``fused_lm_head=True`` the model's own forward runs (generation is unchanged).
* The logits are ``softcap * tanh(logit_scale * x / softcap) / temperature``, softcap and scale read from the
  text config as TRL reads them (``final_logit_softcapping``; ``logit_scale``, else ``output_multiplier``, else
  ``lm_head_multiplier``, else ``1 / logits_scaling``, which HyperCLOVA X multiplies by instead).
* Only the counted positions reach the head (:func:`liger_registry.kernels.fused_linear_logprobs`): one tile of
  logits at a time; ``log_probs`` and ``entropy`` carry gradients. The head's weight is read as the fused cross
  entropy reads it (PEFT ``modules_to_save`` and LoRA heads, FSDP / ZeRO-3 sharded heads); a head that is not one
  linear projection gets its logits materialised instead.
Importing this module does not import TRL; :func:`use_for_trl_fused_head` does.
"""

from __future__ import annotations

import functools
import sys
import types
import warnings
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from transformers.utils import ModelOutput

from liger_registry.constants import IGNORE_INDEX
from liger_registry.forwards.head import call_fused_head
from liger_registry.kernels.rl_head import OUTPUTS, fused_linear_logprobs
from liger_registry.kernels.rl_head.reference import logit_stats
from liger_registry.kernels.rl_head.stats import flags_of

__all__ = [
    "FusedHeadOutput",
    "TrlHeadSwitch",
    "add_fused_lm_head",
    "remove_fused_lm_head",
    "use_for_trl_fused_head",
]

_ORIGINAL = "_liger_registry_forward_before_fused_head"


@dataclass
class FusedHeadOutput(ModelOutput):
    """What a model given :func:`add_fused_lm_head` returns with ``fused_lm_head=True`` (TRL's
    ``FusedCausalLMOutput`` fields); per-token fields not asked for are None."""

    loss: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    label_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def logit_transform_of(text_config: Any) -> tuple[float | None, float]:
    """``(softcap, logit_scale)`` of a text config, read as TRL's fused head reads them."""
    softcap = getattr(text_config, "final_logit_softcapping", None)
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        scale = getattr(text_config, name, None)
        if scale is not None:
            return softcap, float(scale)
    divisor = getattr(text_config, "logits_scaling", None)
    if divisor is None:
        return softcap, 1.0
    hyperclova = getattr(text_config, "model_type", None) == "hyperclovax"
    return softcap, float(divisor) if hyperclova else 1.0 / float(divisor)


@dataclass(frozen=True)
class _Head:
    temperature: float
    softcap: float | None
    logit_scale: float
    outputs: tuple[str, ...]
    cast_fp32: bool
    max_tile_mib: float | None


def add_fused_lm_head(
    model: Any,
    temperature: float = 1.0,
    cast_lm_head_to_fp32: bool = False,
    outputs: Iterable[str] = ("log_probs",),
    *,
    max_tile_mib: float | None = None,
) -> None:
    """Give ``model`` (a transformers causal LM, before any PEFT wrapping) our fused RL head: TRL's
    ``add_fused_lm_head`` contract (see the module docstring). ``cast_lm_head_to_fp32``: the head runs in fp32,
    outside autocast. ``max_tile_mib``: the logits tile budget of the kernel. Giving a model the head again
    replaces the previous one; :func:`remove_fused_lm_head` takes it back."""
    outputs = tuple(outputs)
    flags_of(outputs)  # a ValueError names an unknown output before the model is touched
    text_config = model.config.get_text_config()
    softcap, scale = logit_transform_of(text_config)
    head = _Head(float(temperature), softcap, scale, outputs, bool(cast_lm_head_to_fp32), max_tile_mib)
    remove_fused_lm_head(model)
    original = model.__dict__.get("forward")
    own_forward = model.forward

    @functools.wraps(type(model).forward)  # generate() checks its keyword arguments against this signature
    def forward(
        self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw
    ):
        if not fused_lm_head:
            passed = {
                "labels": labels,
                "shift_labels": shift_labels,
                "num_items_in_batch": num_items_in_batch,
            }
            return own_forward(*args, **kw, **{k: v for k, v in passed.items() if v is not None})
        return _fused_forward(self, head, text_config, args, kw, labels, shift_labels, num_items_in_batch)

    model.forward = types.MethodType(forward, model)
    setattr(model, _ORIGINAL, (original,))


def remove_fused_lm_head(model: Any) -> bool:
    """Take back a head :func:`add_fused_lm_head` gave ``model``; False when it has none."""
    saved = model.__dict__.pop(_ORIGINAL, None)
    if saved is None:
        return False
    model.__dict__.pop("forward", None)
    if saved[0] is not None:
        model.forward = saved[0]
    return True


def _fused_forward(model, head: _Head, text_config, args, kwargs, labels, shift_labels, num_items_in_batch):
    if labels is None and shift_labels is None:
        raise ValueError("fused_lm_head=True needs labels (or shift_labels): the head scores the next tokens")
    kwargs["use_cache"] = False
    if getattr(text_config, "output_router_logits", False):
        kwargs.setdefault("output_router_logits", True)
    out = model.base_model(*args, **kwargs)
    hidden = out.last_hidden_state
    if shift_labels is None:
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    else:
        labels = shift_labels
    lm_head = model.get_output_embeddings()
    device = next(lm_head.parameters()).device
    hidden, labels = hidden.to(device), labels.to(device)
    mask = labels != IGNORE_INDEX
    rows, target = hidden[mask], labels[mask]
    ctx = nullcontext()
    if head.cast_fp32:
        rows, ctx = rows.float(), torch.autocast(device.type, enabled=False)
    with ctx:
        stats = _head_stats(lm_head, rows, target, head)
    per_token = [None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x) for x in stats]
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    loss = -per_token[0].sum() / count
    aux = _aux_loss(out, text_config, kwargs) if kwargs.get("output_router_logits") else None
    if aux is not None:
        loss = loss + getattr(text_config, "router_aux_loss_coef", 0.0) * aux
    return FusedHeadOutput(loss, *per_token, label_mask=mask, aux_loss=aux)


def _head_stats(lm_head, rows, target, head: _Head):
    def compute(h, weight, bias):
        if isinstance(weight, DTensor):  # FSDP2 outside the head's own forward
            weight = weight.full_tensor()
            bias = None if bias is None else bias.full_tensor()
        return fused_linear_logprobs(
            h, weight, target, bias, temperature=head.temperature, softcap=head.softcap,
            logit_scale=head.logit_scale, outputs=head.outputs, max_tile_mib=head.max_tile_mib,
        )  # fmt: skip

    fused = call_fused_head(lm_head, rows, compute)
    if fused is not None:
        return fused
    warnings.warn(
        f"liger_registry: the lm_head {type(lm_head).__qualname__} is not one linear projection; the fused RL "
        "head materialises its logits",
        stacklevel=4,
    )
    z = lm_head(rows).float() * head.logit_scale
    if head.softcap is not None:
        z = head.softcap * torch.tanh(z / head.softcap)
    every = logit_stats(z / head.temperature, target)
    return [
        x if name == "log_probs" or name in head.outputs else None
        for name, x in zip(OUTPUTS, every, strict=True)
    ]


def _aux_loss(out, text_config, kwargs):
    """The MoE load-balancing loss of the router logits (the one every MoE family's forward uses)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    experts = getattr(text_config, "num_experts", None) or getattr(text_config, "num_local_experts", None)
    return load_balancing_loss_func(
        out.router_logits, experts, text_config.num_experts_per_tok, kwargs.get("attention_mask")
    )


# ---------------------------------------------------------------- the switch for TRL's trainers
class TrlHeadSwitch:
    """Handle of :func:`use_for_trl_fused_head`: ``undo()`` (or leaving its ``with`` block) gives TRL's trainers
    TRL's own head back for the models they build from then on. ``models``: the models that got ours."""

    def __init__(self, trl_head, max_tile_mib: float | None) -> None:
        self.trl_head = trl_head
        self.models: list[Any] = []
        self.active = True

        @functools.wraps(trl_head)
        def install(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=("log_probs",)):
            add_fused_lm_head(model, temperature, cast_lm_head_to_fp32, outputs, max_tile_mib=max_tile_mib)
            self.models.append(model)

        install.liger_registry_switch = self
        self.install = install

    def undo(self) -> None:
        """Every TRL module that holds our installer gets TRL's function back (also modules imported while the
        switch was on). Models already given our head keep it (:func:`remove_fused_lm_head`)."""
        for module in _trl_modules():
            if getattr(module, "add_fused_lm_head", None) is self.install:
                module.add_fused_lm_head = self.trl_head
        self.active = False

    def __enter__(self) -> TrlHeadSwitch:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()


def _trl_modules():
    return [m for name, m in list(sys.modules.items()) if (name == "trl" or name.startswith("trl.")) and m]


def use_for_trl_fused_head(max_tile_mib: float | None = None) -> TrlHeadSwitch:
    """Make TRL's trainers give their models our RL head: every ``trl`` module's ``add_fused_lm_head`` (its
    definition in ``trl.trainer.utils`` and the names ``GRPOTrainer``, ``RLOOTrainer``, ``DPOTrainer``,
    ``KTOTrainer``, ``SFTTrainer`` bound at import) becomes ours until :meth:`TrlHeadSwitch.undo`. Switch it on
    before building the trainer (the trainer adds the head in its ``__init__``). A second switch while one is on
    is a RuntimeError."""
    import importlib

    utils = importlib.import_module("trl.trainer.utils")
    current = utils.add_fused_lm_head
    if getattr(current, "liger_registry_switch", None) is not None:
        raise RuntimeError("use_for_trl_fused_head is already on: undo() the switch before another")
    for name in ("grpo_trainer", "rloo_trainer"):  # the RL trainers, whose head asks for the entropy
        importlib.import_module(f"trl.trainer.{name}")
    switch = TrlHeadSwitch(current, max_tile_mib)
    for module in _trl_modules():
        if getattr(module, "add_fused_lm_head", None) is current:
            module.add_fused_lm_head = switch.install
    return switch
