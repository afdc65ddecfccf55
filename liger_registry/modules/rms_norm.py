"""RMSNorm module forward that calls the fused kernel with the module's own weight and epsilon."""

from __future__ import annotations

from liger_registry import kernels
from liger_registry.modules.module_attr import attr_reader
from liger_registry.modules.wiring import makes
from liger_registry.schemas import RmsNormSpec


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
