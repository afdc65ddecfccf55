"""``torch.library`` custom op around the Triton launcher of the rope variants (the norm and GLU variants are
ops of ``kernels.norm`` and ``kernels.glu``).

The variants' autograd Functions stay as they are; what torch.compile could not trace is the Triton launch
inside them (the interpreter's on CPU, host-side launch logic on the GPU). Under torch.compile a Function calls
these ops, each one opaque node with a fake; eagerly it calls the launcher itself (no dispatcher round trip).
Outputs: the launchers write fresh tensors, contiguous (rows) except RoPE's, which keep q's / k's layout
(``rope_out_like``, as the plain rope op); the fakes give exactly those.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import triton_rope_variants
from .custom_ops import NS
from .triton_rope_variants import rope_out_like


def _dispatching(op, launcher):
    """A call of the custom op under torch.compile, of the launcher itself eagerly."""

    def run(*args):
        return op(*args) if torch.compiler.is_compiling() else launcher(*args)

    return run


# ---------------------------------------------------------------- rope variants
def _rope_variant_launch(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    rotary_dim: int,
    interleaved: bool,
    cos_per_pair: bool,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype,
    backward: bool,
) -> tuple[Tensor, Tensor]:
    return triton_rope_variants.rope_variant_apply(
        q,
        k,
        cos,
        sin,
        rotary_dim=rotary_dim,
        interleaved=interleaved,
        cos_per_pair=cos_per_pair,
        q_dtype=q_dtype,
        k_dtype=k_dtype,
        backward=backward,
    )


rope_variant_op = torch.library.custom_op(f"{NS}::rope_variant", _rope_variant_launch, mutates_args=())


@rope_variant_op.register_fake
def _(q, k, cos, sin, rotary_dim, interleaved, cos_per_pair, q_dtype, k_dtype, backward):
    return rope_out_like(q, q_dtype), rope_out_like(k, k_dtype)


rope_variant = _dispatching(rope_variant_op, _rope_variant_launch)
