"""A dotted attribute path (`ffn_config.moe_num_experts`): its syntax, how it is read from an object, and the
one rule for the language model's config inside a model's config."""

from __future__ import annotations

import re
from typing import Any

# \Z, not $: "$" also matches before a trailing newline
ATTR_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def checked_path(path: str) -> str:
    """The path itself when it is attribute names joined by dots; ValueError (a schema error) otherwise."""
    if not ATTR_PATH.match(path):
        raise ValueError(
            f"{path!r} is not an attribute name or a dotted path of names (ffn_config.moe_top_k)"
        )
    return path


def read_path(obj: Any, path: str) -> Any:
    """`obj.a.b` for the path "a.b"; None where any step is missing or None (as getattr(obj, name, None))."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def text_config(config: Any, attr: str | None) -> Any:
    """The language model's config inside ``config``: the family's ``text_config_attr`` (``config`` itself when
    absent), else transformers' ``get_text_config()`` (a text-only config is its own; a nested one is found)."""
    if attr:
        return getattr(config, attr, config)
    return config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
