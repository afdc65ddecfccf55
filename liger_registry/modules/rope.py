"""RoPE drop-ins: transformers' ``apply_rotary_pos_emb`` on the fused q-and-k kernel, and the families' own rotary
functions the plain rotate-half drop-in cannot serve (each with the signature and result dtype of the function it
replaces, named in its docstring, calling the one rope-variant op with that family's layout)."""

from __future__ import annotations

import torch

from liger_registry import kernels
from liger_registry.kernels.rotary import rope_variant
from liger_registry.modules.wiring import makes


@makes("rope")
def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Same contract as HF's: cos/sin are [batch, seq, head_dim]; unsqueeze_dim 1 means q is [b, h, s, d].

    `position_ids` is accepted and unused, as in HF releases that still passed it positionally.
    The results have q's and k's dtypes: families such as OLMo 2 pass fp32 cos/sin with bf16 q and k and
    cast back after rotating, and the next projection expects that. ``unsqueeze_dim=0`` with a 2-D
    [seq, head_dim] table is Pixtral's vision attention (one table for every image row and head).
    """
    if unsqueeze_dim == 2:  # q and k are [batch, seq, heads, head_dim]
        q_out, k_out = kernels.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        q_out, k_out = q_out.transpose(1, 2), k_out.transpose(1, 2)
    elif unsqueeze_dim == 1 or (unsqueeze_dim == 0 and cos.dim() == 2):
        q_out, k_out = kernels.rope(q, k, cos, sin)
    else:
        raise ValueError(
            f"apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2 (0 with a 2-D cos/sin), got {unsqueeze_dim}"
        )
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


@makes("rope", variant="interleaved_repeated")
def apply_rotary_pos_emb_interleaved_repeated(q, k, cos, sin, unsqueeze_dim=1):
    """Interleaved-pair RoPE on the first ``cos.shape[-1]`` dims with cos/sin repeat-interleaved (pair j's value
    at 2j and 2j + 1): ``apply_rotary_pos_emb`` of glm4v, whose M-RoPE recomposes the sections and then repeats
    each frequency. Result dtype ``promote_types(q.dtype, cos.dtype)``, as theirs."""
    # A contiguous copy of the even columns: [batch, seq, rotary_dim / 2], a few KiB.
    return _rope(
        q,
        k,
        cos[..., ::2].contiguous(),
        sin[..., ::2].contiguous(),
        unsqueeze_dim,
        interleaved=True,
        cos_per_pair=True,
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


@makes("rope", variant="complex_heads_first")
def apply_rotary_emb_heads_first(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """DeepSeek-V2's ``apply_rotary_emb``: llama4's complex product (interleaved pairs times ``freqs_cis``
    [batch, seq, head_dim / 2], in fp32, results in xq's / xk's dtypes) on xq/xk [batch, heads, seq, head_dim]."""
    freqs_cis = freqs_cis.to(xq.device)
    return rope_variant(
        xq, xk, freqs_cis.real, freqs_cis.imag, interleaved=True, cos_per_pair=True, upcast=True
    )


def _evens_then_odds(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


@makes("rope", variant="deinterleave")
def apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """``apply_rotary_pos_emb_interleave`` of deepseek_v3 and glm4_moe_lite: pair j is (2j, 2j + 1), rotated by
    ``cos[..., j]`` (cos/sin are ``cat(freqs, freqs)``), and the result is written as halves, the pairs' first
    elements then their second. That is rotate-half with one cos per pair on the de-interleaved input, which
    is what runs (the de-interleave is one copy of the rotary part). Result dtype
    ``promote_types(q.dtype, cos.dtype)``, as theirs."""
    half = cos.shape[-1] // 2
    q, k = _evens_then_odds(q), _evens_then_odds(k)
    return _rope(q, k, cos[..., :half], sin[..., :half], unsqueeze_dim, cos_per_pair=True)


@makes("rope", variant="one_tensor")
def apply_rotary_pos_emb_one_tensor(x, cos, sin, unsqueeze_dim=1):
    """Gemma 4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``: rotate-half of one tensor per call (its
    attention rotates q and k apart, a KV-shared layer only q; its vision tower calls it by keyword on each
    axis's channels). Runs the q-and-k kernel with k empty (no heads). Result dtype
    ``promote_types(x.dtype, cos.dtype)``, as theirs."""
    (xh,) = _heads_first(unsqueeze_dim, x)
    out, _ = rope_variant(xh, xh[:, :0], cos, sin)
    return _heads_first(unsqueeze_dim, out)[0]


@makes("rope", variant="one_tensor_trailing")
def apply_rotary_pos_emb_one_tensor_trailing(x, cos, sin, unsqueeze_dim=1):
    """DeepSeek-V4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``: each head is ``[nope | rope]``; cos/sin
    hold one value per pair ``[batch, seq, R / 2]`` (V4 repeat-interleaves them to R), interleaved pairs (2j, 2j+1)
    of the trailing ``R`` channels rotated in fp32, the nope channels passed through; result in x's dtype. V4
    rotates q, the shared kv, the compressed entries, and the attention output back with ``-sin``."""
    # cat(c, c): pair j reads column j for both dims, and the rotation is V4's formula in fp32 op for op (one cos
    # per pair with upcast would be llama4's complex product, which rounds differently on CPU).
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    rot = cos.shape[-1]
    (xh,) = _heads_first(unsqueeze_dim, x)
    nope = xh.shape[-1] - rot
    rope_part = xh[..., nope:]
    out, _ = rope_variant(rope_part, rope_part[:, :0], cos, sin, interleaved=True, upcast=True)
    out = torch.cat((xh[..., :nope], out), dim=-1)
    return _heads_first(unsqueeze_dim, out)[0]
