"""Causal-LM forwards that the registry installs; each names `skip_logits` in its signature."""

from liger_registry.forwards import causal_lm, original_head  # noqa: F401  (register the built-in forwards)
from liger_registry.forwards.context import ForwardContext, bind_forward
from liger_registry.forwards.registry import ForwardSpec, get_forward, register_forward, registered_forwards
from liger_registry.forwards.skip_logits import resolve_skip_logits

__all__ = [
    "ForwardContext",
    "ForwardSpec",
    "bind_forward",
    "get_forward",
    "register_forward",
    "registered_forwards",
    "resolve_skip_logits",
]
