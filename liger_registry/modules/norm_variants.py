"""Module forwards for the norm variants: nemotron's LayerNorm1P on the fused LayerNorm kernel, and its maker."""

from __future__ import annotations

from liger_registry.kernels.norm import layer_norm_1p
from liger_registry.modules.wiring import makes


def layer_norm_1p_forward(self, input):
    """``NemotronLayerNorm1P.forward``: ``layer_norm(input, weight + 1, bias, eps)``."""
    return layer_norm_1p(input, self.weight, self.bias, self.eps)


@makes("layer_norm", variant="1p")
def layer_norm_1p_module_forward(spec):
    """The layer_norm kind's maker for ``offset: 1.0``; epsilon from the spec's ``eps_attr``."""
    eps_attr = spec.eps_attr

    def forward(self, input):
        return layer_norm_1p(input, self.weight, self.bias, getattr(self, eps_attr))

    return forward
