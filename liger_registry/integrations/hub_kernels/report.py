"""Which layers of a model run liger_registry's kernels through transformers' kernel mapping."""

from __future__ import annotations

from torch import nn

from liger_registry.integrations.hub_kernels import dispatch, layers

_OURS = {layers.RMSNorm.forward: dispatch.norm_forward, layers.RotaryPosEmb.forward: dispatch.rotary_function}


def kernelized_layers(model: nn.Module) -> dict[str, bool]:
    """{name: runs our kernel} for every layer of `model` whose forward kernelize bound to one of our layers:
    True where our kernel runs, False where no family entry serves the layer's class (or rotary function), so it
    computes as its own forward does. Function modules are named ``<module>.<function>``."""
    found = {}
    for name, _, module in dispatch.hub_layers(model):
        forward = getattr(module.__dict__.get("forward"), "__func__", None)
        if forward in _OURS:
            found[name] = _OURS[forward](type(module)) is not None
    return found
