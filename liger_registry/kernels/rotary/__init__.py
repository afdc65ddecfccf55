"""RoPE: the rotary embedding of q and k in the layouts of the Hugging Face families, one op with options.

For q/k [batch, heads, seq, head_dim] (any strides, e.g. a transposed [batch, seq, heads, head_dim] view) and
cos/sin [batch or 1, seq, C] or [seq, C] (the vision towers' table, broadcast over batch and heads):

* rotate-half, one cos per element (:func:`rope`, or :func:`rope_variant` with the defaults): rotary dim
  R = C <= head_dim; dims j and j + R/2 form a pair; dims >= R pass through (phi3's partial_rotary_factor,
  qwen3_next, qwen3_5, nemotron; llama when R = head_dim).
* interleaved (``interleaved=True``): dims 2j and 2j + 1 form pair j (glm/glm4 with cos[..., :R/2], llama4).
* one cos per pair (``cos_per_pair=True``): C = R/2 and pair j uses cos[j] for both of its dims (gpt_oss's
  half-split ``_apply_rotary_emb``, llama4's ``freqs_cis``).
* ``rotary_dim=R``: rotate the first R dims by the table's first R (or R/2, one cos per pair) columns; a wider
  table's other columns are not read (default: R from the table's width).
* ``upcast=True``: rotate in fp32 and return q's / k's dtypes (llama4's complex multiply, which the torch
  path computes as a complex product when the pairs are interleaved with one cos per pair); otherwise the
  result has ``promote_types(q.dtype, cos.dtype)`` as the HF functions do.
* The PyTorch twin (``reference``) computes what the family functions compute, op for op (bit-equal on CPU);
  the Triton kernel rotates in fp32 and rounds once. Gradients flow to q and k, not to cos/sin.
"""

from __future__ import annotations

from torch import Tensor

from .op import ROPE, ROPE_VARIANT
from .reference import check_rope_shapes, check_variant_shapes, rope_torch, rope_variant_torch


def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q and k [batch, heads, seq, head_dim] with cos/sin [batch or 1, seq, C] or [seq, C].
    C = head_dim (even): identical to HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``. Any other
    head_dim or width, as liger-kernel's rope accepts them: an odd head_dim, a table wider than head_dim (C >=
    head_dim // 2): pairs (j, j + head_dim // 2) rotated by ``cos[..., j]``, an odd head_dim's last dim passed
    through (see ``reference.plain_layout``). Returns ``(q_out, k_out)``."""
    check_rope_shapes(q, k, cos, sin)
    return ROPE(q, k, cos, sin)


def rope_variant(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    interleaved: bool = False,
    cos_per_pair: bool = False,
    upcast: bool = False,
    rotary_dim: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q and k by cos/sin in one of the layouts of the package docstring. Returns
    ``(q_out, k_out)``."""
    check_variant_shapes(q, k, cos, sin, cos_per_pair, rotary_dim)
    return ROPE_VARIANT(q, k, cos, sin, interleaved, cos_per_pair, upcast, rotary_dim)


__all__ = ["rope", "rope_torch", "rope_variant", "rope_variant_torch"]
