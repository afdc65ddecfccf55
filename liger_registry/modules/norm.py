"""Norm module forwards: RMSNorm (with or without a weight) and LayerNorm on the fused kernels with each module's
own weight, bias and epsilon, and nemotron's LayerNorm1P (``weight + 1``) on the LayerNorm kernel."""

from __future__ import annotations

from liger_registry import kernels
from liger_registry.kernels.norm import layer_norm_1p
from liger_registry.modules.module_attr import attr_reader
from liger_registry.modules.wiring import makes
from liger_registry.schemas import LayerNormSpec, RmsNormSpec


@makes("rms_norm")
def rms_norm_forward(spec: RmsNormSpec):
    """A module without a weight normalises without a scale: ``nn.RMSNorm(elementwise_affine=False)`` holds
    ``weight = None``, Gemma3n's / Gemma4's ``with_scale=False`` norms hold no weight attribute at all."""
    offset, mode, weight_attr, read_eps = (
        float(spec.offset),
        spec.casting_mode,
        spec.weight_attr,
        attr_reader(spec.eps_attr),
    )

    def forward(self, hidden_states):
        return kernels.rms_norm(
            hidden_states,
            getattr(self, weight_attr, None),
            read_eps(self),
            offset=offset,
            casting_mode=mode,
        )

    return forward


def _eps_reader(spec: LayerNormSpec):
    if spec.eps is not None:
        eps = float(spec.eps)
        return lambda module: eps
    return attr_reader(spec.eps_attr)


def _layer_norm_broadcast(x, weight, bias, eps):
    """CohereLayerNorm's QK norm: each row of x's last dim normalised, then scaled by a [heads, head_dim] weight,
    all in fp32 and rounded once to x's dtype, as Cohere computes it (the kernel takes a [head_dim] weight)."""
    y = kernels.layer_norm(x.float(), None, None, eps) * weight.float()
    return (y if bias is None else y + bias.float()).to(x.dtype)


@makes("layer_norm")
def layer_norm_forward(spec: LayerNormSpec):
    """A module without a ``bias`` attribute (CohereLayerNorm) adds none; one without a ``weight`` (OlmoLayerNorm)
    scales by none; ``broadcast_weight``: a weight of x's trailing shape (see :func:`_layer_norm_broadcast`)."""
    read_eps, broadcast = _eps_reader(spec), spec.broadcast_weight

    def forward(self, hidden_states):
        weight, bias = getattr(self, "weight", None), getattr(self, "bias", None)
        if broadcast and weight is not None and weight.dim() > 1:
            return _layer_norm_broadcast(hidden_states, weight, bias, read_eps(self))
        return kernels.layer_norm(hidden_states, weight, bias, read_eps(self))

    return forward


def layer_norm_1p_forward(self, input):
    """``NemotronLayerNorm1P.forward``: ``layer_norm(input, weight + 1, bias, eps)``."""
    return layer_norm_1p(input, self.weight, self.bias, self.eps)


@makes("layer_norm", variant="1p")
def layer_norm_1p_module_forward(spec):
    """The layer_norm kind's maker for ``offset: 1.0``; epsilon from the spec's ``eps`` or ``eps_attr``."""
    read_eps = _eps_reader(spec)

    def forward(self, input):
        return layer_norm_1p(input, self.weight, self.bias, read_eps(self))

    return forward
