"""Triton RoPE in the rotate_half convention (HF layout): the full-width case of ``triton_rope_variants``."""

from __future__ import annotations

import torch

from .triton_rope_variants import rope_variant_apply


def rope_apply(q, k, cos, sin, backward: bool = False):
    """Rotate q [B, Hq, S, D] and k [B, Hk, S, D] by cos/sin [B or 1, S, D]; ``backward`` applies the transpose.
    Results in ``promote(q, cos)`` / ``promote(k, cos)`` with q's / k's layout, as HF's function gives; the
    backward's (q, k are the gradients) in their own dtypes."""
    if cos.shape != sin.shape:
        raise ValueError("rope: cos and sin shapes differ")
    promote = not backward
    return rope_variant_apply(
        q,
        k,
        cos,
        sin,
        rotary_dim=q.shape[-1],
        interleaved=False,
        cos_per_pair=False,
        q_dtype=torch.promote_types(q.dtype, cos.dtype) if promote else q.dtype,
        k_dtype=torch.promote_types(k.dtype, cos.dtype) if promote else k.dtype,
        backward=backward,
    )
