"""Causal-LM forwards that the registry installs; each names `skip_logits` in its signature.

The table (`register_forward`, `get_forward`, ...) imports without torch; the forwards themselves load on use.
"""

from liger_registry.forwards.registry import (
    BUILTIN_FORWARDS,
    ForwardSpec,
    forward_names,
    get_forward,
    register_forward,
    registered_forwards,
)
from liger_registry.forwards.skip_logits import resolve_skip_logits

__all__ = [
    "BUILTIN_FORWARDS",
    "ForwardContext",
    "ForwardSpec",
    "bind_forward",
    "forward_names",
    "get_forward",
    "register_forward",
    "registered_forwards",
    "resolve_skip_logits",
]


def __getattr__(name: str):
    if name in ("ForwardContext", "bind_forward"):
        from liger_registry.forwards import context

        return getattr(context, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
