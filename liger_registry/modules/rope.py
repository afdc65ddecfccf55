"""Drop-in for transformers' apply_rotary_pos_emb, calling the fused q-and-k rotary kernel."""

from __future__ import annotations

from liger_registry import kernels
from liger_registry.modules.wiring import makes


@makes("rope")
def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Same contract as HF's: cos/sin are [batch, seq, head_dim]; unsqueeze_dim 1 means q is [b, h, s, d].

    `position_ids` is accepted and unused, as in HF releases that still passed it positionally.
    The results have q's and k's dtypes: families such as OLMo 2 pass fp32 cos/sin with bf16 q and k and
    cast back after rotating, and the next projection expects that.
    """
    if unsqueeze_dim == 2:  # q and k are [batch, seq, heads, head_dim]
        q_out, k_out = kernels.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        q_out, k_out = q_out.transpose(1, 2), k_out.transpose(1, 2)
    elif unsqueeze_dim == 1:
        q_out, k_out = kernels.rope(q, k, cos, sin)
    else:
        raise ValueError(f"apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")
    return q_out.to(q.dtype), k_out.to(k.dtype)
