"""LayerNorm module forward that calls the fused kernel with the module's weight, bias and epsilon."""

from __future__ import annotations

from liger_registry import kernels
from liger_registry.modules.wiring import makes
from liger_registry.schemas import LayerNormSpec


@makes("layer_norm")
def layer_norm_forward(spec: LayerNormSpec):
    eps_attr = spec.eps_attr

    def forward(self, hidden_states):
        return kernels.layer_norm(hidden_states, self.weight, self.bias, getattr(self, eps_attr))

    return forward
