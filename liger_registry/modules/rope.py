"""RoPE drop-ins: transformers' ``apply_rotary_pos_emb`` on the fused q-and-k kernel, and the families' own rotary
functions the plain rotate-half drop-in cannot serve (each with the signature and result dtype of the function it
replaces, named in its docstring, calling the one rope-variant op with that family's layout)."""

from __future__ import annotations

import torch

from liger_registry import kernels
from liger_registry.kernels.rope import rope_variant
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


def _heads_first(unsqueeze_dim: int, *xs):
    if unsqueeze_dim == 1:
        return xs
    if unsqueeze_dim == 2:  # [batch, seq, heads, head_dim]: a transposed view, no copy
        return tuple(x.transpose(1, 2) for x in xs)
    raise ValueError(f"apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")


def _rope(q, k, cos, sin, unsqueeze_dim: int, **layout):
    qh, kh = _heads_first(unsqueeze_dim, q, k)
    q_out, k_out = rope_variant(qh, kh, cos, sin, **layout)
    return _heads_first(unsqueeze_dim, q_out, k_out)


@makes("rope", variant="partial")
def apply_rotary_pos_emb_partial(q, k, cos, sin, unsqueeze_dim=1):
    """Rotate-half RoPE on the first ``cos.shape[-1]`` dims, the rest passed through: ``apply_rotary_pos_emb``
    of phi3, nemotron, qwen3_next, qwen3_5, qwen3_5_moe (and every llama-style family when the rotary dim is
    the head dim). Result dtype ``promote_types(q.dtype, cos.dtype)``, as theirs."""
    return _rope(q, k, cos, sin, unsqueeze_dim)


@makes("rope", variant="interleaved")
def apply_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim=1):
    """Interleaved-pair RoPE on the first ``cos.shape[-1]`` dims, pair j rotated by ``cos[..., j]``:
    ``apply_rotary_pos_emb`` of glm and glm4 (their ``rotate_half`` pairs dims 2j and 2j + 1)."""
    half = cos.shape[-1] // 2
    return _rope(q, k, cos[..., :half], sin[..., :half], unsqueeze_dim, interleaved=True, cos_per_pair=True)


@makes("rope", variant="interleaved_fp32")
def apply_rotary_pos_emb_interleaved_fp32(q, k, cos, sin, unsqueeze_dim=1):
    """The interleaved layout rotated in fp32 with results in q's / k's dtypes: ``apply_rotary_pos_emb`` of
    ernie4_5 and ernie4_5_moe (their rotary embedding keeps cos/sin in fp32 and the function casts back)."""
    half = cos.shape[-1] // 2
    return _rope(
        q,
        k,
        cos[..., :half],
        sin[..., :half],
        unsqueeze_dim,
        interleaved=True,
        cos_per_pair=True,
        upcast=True,
    )


@makes("rope", variant="half_split")
def apply_rotary_pos_emb_half_split(q, k, cos, sin, unsqueeze_dim=1):
    """GPT-OSS's ``apply_rotary_pos_emb`` (``_apply_rotary_emb``): the head splits in two halves, pair j is
    (j, j + head_dim/2), and cos/sin hold one value per pair ([batch, seq, head_dim / 2])."""
    return _rope(q, k, cos, sin, unsqueeze_dim, cos_per_pair=True)


@makes("rope", variant="complex")
def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """Llama 4's ``apply_rotary_emb``: xq/xk [batch, seq, heads, head_dim], interleaved pairs multiplied by
    the complex ``freqs_cis`` [batch, seq, head_dim / 2] in fp32, results in xq's / xk's dtypes."""
    cos, sin = freqs_cis.real, freqs_cis.imag
    q_out, k_out = rope_variant(
        xq.transpose(1, 2), xk.transpose(1, 2), cos, sin, interleaved=True, cos_per_pair=True, upcast=True
    )
    return q_out.transpose(1, 2), k_out.transpose(1, 2)
