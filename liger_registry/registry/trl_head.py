"""Finds TRL's fused LM head on a model: TRL's trainers wrap the model's forward with it and compute the loss
from the hidden states through it, so apply installs the decoder kernels under it instead of replacing it."""

from __future__ import annotations

from typing import Any

KEYWORD = "fused_lm_head"  # what TRL's trainers pass to the forward its `add_fused_lm_head` installs


def trl_fused_head(model: Any) -> str | None:
    """The qualified name of the model's own forward when it is a fused LM head in TRL's convention (it takes
    `fused_lm_head=`), else None."""
    function = getattr(vars(model).get("forward"), "__func__", None)
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    keywords = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    if KEYWORD not in keywords:
        return None
    return f"{function.__globals__.get('__name__', '?')}.{code.co_name}"
