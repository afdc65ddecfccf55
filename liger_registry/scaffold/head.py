"""Decides the causal-LM head of a drafted entry: projection, decoder, logit post-processing, router aux loss."""

from __future__ import annotations

import inspect as pyinspect
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from liger_registry.attr_path import read_path
from liger_registry.scaffold.decide import decide_logit_roles
from liger_registry.scaffold.inspect import ModelSource, child_name, source_mentions

_AUX_CALL = re.compile(r"load_balancing_loss_func\(\s*outputs\.router_logits,\s*self\.(\w+),\s*self\.(\w+)")
_AUX_COEF = re.compile(r"loss\s*\+=\s*self\.(\w+)\s*\*\s*aux_loss")
# `self.num_experts = config.ffn_config.moe_num_experts` in the causal LM's __init__: (attribute, config path)
_SELF_FROM_CONFIG_PATH = re.compile(r"self\.(\w+)\s*=\s*(?:self\.)?config\.(\w+(?:\.\w+)*)\s*$", re.M)
# What causal_lm_moe reads, in order: the ForCausalLM's attribute, then the (text) config's.
MOE_NAMES = (("num_experts", "num_local_experts"), ("num_experts_per_tok",), ("router_aux_loss_coef",))
MOE_FIELDS = ("num_experts_attrs", "top_k_attr", "coefficient_attr")  # the head.moe field of each


class HeadRefused(Exception):
    """The head does something the registered forwards cannot reproduce."""


@dataclass
class HeadDecision:
    forward: str
    head: dict[str, Any]
    roles: dict[str, str]  # logit post-processing: HeadSpec field -> config attribute


def _moe_value(model: nn.Module, config: Any, names: tuple[str, ...]) -> Any:
    value = getattr(model, names[0], None)
    for name in names:
        value = getattr(config, name, None) if value is None else value
    return value


def _config_path(source: ModelSource, attr: str, config: Any, value: Any) -> str | None:
    """Where in the config the causal LM's __init__ reads `self.attr` from, as a dotted path (JetMoE's
    aux_loss_coef, DBRX's ffn_config.moe_loss_weight), when the config holds the same value there."""
    try:
        init = pyinspect.getsource(source.causal_lm.__init__)
    except (OSError, TypeError):
        init = ""
    paths = [p for a, p in _SELF_FROM_CONFIG_PATH.findall(init) if a == attr]
    paths.append(attr)  # the config's own attribute of that name
    return next((p for p in paths if value is not None and read_path(config, p) == value), None)


def _router_loss_names(model: nn.Module, source: ModelSource, config: Any) -> dict[str, Any]:
    """The head.moe names causal_lm_moe must read to get the original's expert count, top-k and coefficient:
    {} where the defaults do (and the config holds them, as the lint checks); else where the original's config
    holds them: its own names or a dotted path into a nested config; HeadRefused where it holds them nowhere."""
    if not callable(getattr(source.module, "load_balancing_loss_func", None)):
        raise HeadRefused(f"router aux loss: {source.module_name} has no load_balancing_loss_func")
    code = pyinspect.getsource(source.causal_lm.forward)
    call, coef = _AUX_CALL.search(code), _AUX_COEF.search(code)
    if call is None or coef is None:
        raise HeadRefused(
            "router aux loss: the forward computes it in a way causal_lm_moe does not (unparsed call)"
        )
    names: dict[str, Any] = {}
    for theirs, ours, field in zip((*call.groups(), coef.group(1)), MOE_NAMES, MOE_FIELDS, strict=True):
        value = getattr(model, theirs, None)
        if value == _moe_value(model, config, ours) and any(
            getattr(config, n, None) is not None for n in ours
        ):
            continue
        path = _config_path(source, theirs, config, value)
        if path is None:
            raise HeadRefused(
                f"router aux loss: the original reads self.{theirs}; causal_lm_moe reads {' or '.join(ours)} "
                "(an MoE config name the forward does not know, and the config holds it under no name or path)"
            )
        names[field] = [path] if field == "num_experts_attrs" else path
    return names


def decide_head(
    model: nn.Module, source: ModelSource, text_attr: str | None, candidates: list[str], inputs: dict
) -> HeadDecision:
    """The head spec and forward name, from the built tiny model; HeadRefused where no forward fits."""
    lm_head = model.get_output_embeddings()
    lm_head_attr = child_name(model, lm_head)
    if lm_head_attr is None:
        raise HeadRefused(
            "the output projection is not a direct attribute of the causal LM (nested in a head module)"
        )
    if type(lm_head) is not nn.Linear:
        raise HeadRefused(f"the output projection is a {type(lm_head).__name__}, not a plain nn.Linear")
    base_model = next(
        (
            n
            for n in ("model", getattr(model, "base_model_prefix", ""))
            if n and isinstance(getattr(model, n, None), nn.Module)
        ),
        None,
    )
    if base_model is None:
        raise HeadRefused("the causal LM holds its decoder under neither `.model` nor its base_model_prefix")
    config = model.config.get_text_config()
    raw: list[torch.Tensor] = []
    hook = lm_head.register_forward_hook(lambda mod, args, out: raw.append(out.detach()))
    try:
        with torch.no_grad():
            logits = model.eval()(**inputs).logits
    finally:
        hook.remove()
    if logits is None or len(raw) != 1 or raw[0].shape != logits.shape:
        raise HeadRefused("the forward does not return lm_head(hidden states) as its logits")
    roles = decide_logit_roles(raw[0], logits, config, candidates)
    if roles is None:
        raise HeadRefused(
            f"the head post-processes its logits in a way no scale/multiplier/softcap of {candidates or 'no config value'} "
            "reproduces"
        )
    head: dict[str, Any] = {**roles}
    if lm_head_attr != "lm_head":
        head["lm_head"] = lm_head_attr
    if base_model != "model":
        head["base_model"] = base_model
    if text_attr is not None:
        head["text_config_attr"] = text_attr
    forward = "causal_lm"
    if source_mentions(source.causal_lm, "load_balancing_loss_func"):
        if moe_names := _router_loss_names(model, source, config):
            head["moe"] = moe_names
        forward = "causal_lm_moe"  # it reads whether the original falls back to the config's router switch
    return HeadDecision(forward, head, roles)
