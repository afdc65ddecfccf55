"""Norm module forwards: RMSNorm and LayerNorm on the fused kernels with each module's own weight, bias and
epsilon, and nemotron's LayerNorm1P (``weight + 1``) on the LayerNorm kernel."""

from __future__ import annotations

from liger_registry import kernels
from liger_registry.kernels.norm import layer_norm_1p
from liger_registry.modules.module_attr import attr_reader
from liger_registry.modules.wiring import makes
from liger_registry.schemas import LayerNormSpec, RmsNormSpec


@makes("rms_norm")
def rms_norm_forward(spec: RmsNormSpec):
    offset, mode, weight_attr, read_eps = (
        float(spec.offset),
        spec.casting_mode,
        spec.weight_attr,
        attr_reader(spec.eps_attr),
    )

    def forward(self, hidden_states):
        return kernels.rms_norm(
            hidden_states,
            getattr(self, weight_attr),
            read_eps(self),
            offset=offset,
            casting_mode=mode,
        )

    return forward


@makes("layer_norm")
def layer_norm_forward(spec: LayerNormSpec):
    eps_attr = spec.eps_attr

    def forward(self, hidden_states):
        return kernels.layer_norm(hidden_states, self.weight, self.bias, getattr(self, eps_attr))

    return forward


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
