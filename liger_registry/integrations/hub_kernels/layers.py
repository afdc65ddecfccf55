"""The layers of liger_registry's kernel repository, in the `kernels` convention: stateless (no constructor, no
members but ``forward`` and the mode flags), each ``forward`` with the signature of the layer it replaces and
reading that layer's own attributes. `kernels.kernelize` binds ``forward`` to each module that declares the
layer's hub name; the forward runs the kernel our registry installs on that module's class (or that rotary
function), and the module's own computation where no family entry serves it (:mod:`.dispatch`)."""

from __future__ import annotations

from torch import nn

from liger_registry.integrations.hub_kernels import dispatch


class RMSNorm(nn.Module):
    """For ``@use_kernel_forward_from_hub("RMSNorm")`` classes: our RMSNorm kernel with the class's casting mode,
    offset, weight and epsilon attributes as its family entry states them."""

    # our ops are custom ops with fake implementations and autograd: kernels may use them in every mode
    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        ours = dispatch.norm_forward(type(self))
        if ours is None:
            return type(self).forward(self, hidden_states)
        return ours(self, hidden_states)


class RotaryPosEmb(nn.Module):
    """For ``@use_kernel_forward_from_hub("rotary_pos_emb")`` functions (``apply_rotary_pos_emb(q, k, cos, sin,
    unsqueeze_dim=1)``): our fused q-and-k RoPE kernel in the layout the function's family entry states
    (rotate-half, partial, interleaved, ...)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        ours = dispatch.rotary_function(type(self))
        if ours is None:
            # kernels' function module calls the function it wraps
            return type(self).forward(self, q, k, cos, sin, unsqueeze_dim)
        return ours(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
