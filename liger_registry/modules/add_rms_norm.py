"""Decoder-layer forward that fuses the residual add after attention with the post-attention RMSNorm.

The layer's own parts run as they are (its input norm, attention and MLP, with whatever kernels are installed in
them); only ``hidden = residual + attn_out; normed = post_attention_layernorm(hidden)`` becomes one kernel call.
Installed only on layers whose class's forward is llama-shaped (see :mod:`.layer_shape`) and whose post-attention
norm is one of the family's rms_norm targets with the same casting; anything else is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from liger_registry.kernels.norm import add_rms_norm
from liger_registry.modules.layer_shape import LayerShape, layer_shape, part_class, planned_shape
from liger_registry.modules.module_attr import attr_label, attr_reader, has_attr
from liger_registry.modules.wiring import checks, makes
from liger_registry.schemas import AddRmsNormSpec, FamilyEntry

# Newer transformers checkpoint a GradientCheckpointingLayer inside the forward its class defines (a wrapper made
# when the class is created), which a replaced forward bypasses, so the fused forward checkpoints itself as that
# wrapper does; earlier releases checkpoint in __call__, around whatever forward the layer has.
_CHECKPOINTS_IN_FORWARD = "__init_subclass__" in vars(GradientCheckpointingLayer)


def _checkpoints_here(layer) -> bool:
    return (
        _CHECKPOINTS_IN_FORWARD
        and getattr(layer, "gradient_checkpointing", False)
        and layer.training
        and torch.is_grad_enabled()
    )


def _runs_as_a_module(norm: nn.Module, weight: torch.Tensor | None) -> bool:
    """Whether the norm must be called as a module: a wrapper or hook on it (accelerate's offload hooks load its
    weight from meta when it runs) would be bypassed by reading its weight directly."""
    own = vars(norm).get("forward")
    ours = own is not None and hasattr(getattr(own, "__func__", own), "__liger_switch__")
    return (
        (weight is not None and weight.is_meta)
        or (own is not None and not ours)
        or bool(norm._forward_hooks or norm._forward_pre_hooks)
        or hasattr(norm, "_hf_hook")
    )


@makes("add_rms_norm")
def add_rms_norm_layer_forward(spec: AddRmsNormSpec):
    offset, mode, weight_attr, read_eps = (
        float(spec.offset),
        spec.casting_mode,
        spec.weight_attr,
        attr_reader(spec.eps_attr),
    )

    def fused(self, hidden_states, *args, **kwargs):
        shape = planned_shape(type(self))
        attention_kwargs = shape.attention_kwargs(args, kwargs)
        residual = hidden_states
        hidden_states = getattr(self, shape.input_norm)(hidden_states)
        hidden_states, _ = getattr(self, shape.attention)(hidden_states=hidden_states, **attention_kwargs)
        norm = getattr(self, shape.post_norm)
        # none: a norm without a scale, as rms_norm_forward reads it
        weight = getattr(norm, weight_attr, None)
        if _runs_as_a_module(norm, weight):
            residual = residual + hidden_states
            hidden_states = norm(residual)
        else:
            residual, hidden_states = add_rms_norm(
                hidden_states, residual, weight, read_eps(norm), offset=offset, casting_mode=mode
            )
        hidden_states = getattr(self, shape.mlp)(hidden_states)
        return residual + hidden_states

    def forward(self, hidden_states, *args, **kwargs):
        if not _checkpoints_here(self):
            return fused(self, hidden_states, *args, **kwargs)
        if kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        if not getattr(self, "_can_checkpoint_with_cache", False):
            kwargs.update({name: None for name in ("cache", "layer_past") if kwargs.get(name) is not None})
        return self._gradient_checkpointing_func(partial(fused, self, **kwargs), hidden_states, *args)

    return forward


def _options(spec: Any) -> tuple:
    return spec.casting_mode, float(spec.offset), spec.eps_attr, spec.weight_attr


def _norm_problem(
    spec: AddRmsNormSpec, entry: FamilyEntry, resolve_class: Callable[[FamilyEntry, str], type]
) -> tuple[tuple[type, ...], str | None]:
    """The family's rms_norm classes, or why the fused norm cannot stand for the layer's norm."""
    rms = entry.kernels.rms_norm
    # Off with a reason, the family says its declaration does not hold; off by a bare switch (rms_norm=False),
    # the declared norm still is what the layer computes, and only its own kernel is not installed.
    if rms is None or (not rms.enabled and rms.reason):
        why = "declares none" if rms is None else f"is off ({rms.reason})"
        return (), f"the family's rms_norm kernel {why}: no declared RMSNorm for the post-attention norm"
    if _options(spec) != _options(rms):
        return (), (
            f"casting_mode, offset, eps_attr, weight_attr {_options(spec)} differ from the family's rms_norm "
            f"{_options(rms)}"
        )
    return tuple(resolve_class(entry, t) for t in rms.targets), None


@checks("add_rms_norm")
def add_rms_norm_problem(
    spec: AddRmsNormSpec,
    entry: FamilyEntry,
    target: type | nn.Module,
    resolve_class: Callable[[FamilyEntry, str], type],
) -> str | None:
    """Why the fused forward cannot replace this layer class's (or module's) forward; None when it can.
    ``resolve_class`` is the registry's name resolver, passed in (modules sit below the registry)."""
    cls = target if isinstance(target, type) else type(target)
    shape = layer_shape(cls)
    if not isinstance(shape, LayerShape):
        return shape
    classes, problem = _norm_problem(spec, entry, resolve_class)
    if problem is not None:
        return f"{cls.__name__}: {problem}"
    names = ", ".join(c.__name__ for c in classes)
    if isinstance(target, type):
        built = part_class(cls, shape.post_norm)
        if built not in classes:
            what = "a class its source does not name plainly" if built is None else built.__name__
            return f"{cls.__name__}: its {shape.post_norm} is {what}, not the family's RMSNorm ({names})"
        return None
    norm = getattr(target, shape.post_norm, None)
    if type(norm) not in classes:
        return f"{cls.__name__}: its {shape.post_norm} is {type(norm).__name__}, not the family's RMSNorm ({names})"
    attrs = spec.module_attributes(("weight_attr", "eps_attr"))
    if missing := [attr_label(a) for a in attrs if not has_attr(norm, a)]:
        return f"{cls.__name__}: its {shape.post_norm} has no attribute {', '.join(missing)}"
    return None
