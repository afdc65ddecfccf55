"""RoPE variants as options of one rope op: partial rotary dim, interleaved pairs, one cos per pair, fp32 math.

The layouts of the Hugging Face families, for q/k [batch, heads, seq, head_dim] and cos/sin [batch or 1, seq, C]:

* rotate-half, one cos per element (``cos_per_pair=False``): rotary dim R = C <= head_dim; dims j and j + R/2
  form a pair; dims >= R pass through (phi3's partial_rotary_factor, qwen3_next, qwen3_5, nemotron; llama
  when R = head_dim).
* interleaved (``interleaved=True``): dims 2j and 2j + 1 form pair j (glm/glm4 with cos[..., :R/2], llama4).
* one cos per pair (``cos_per_pair=True``): C = R/2 and pair j uses cos[j] for both of its dims (gpt_oss's
  half-split ``_apply_rotary_emb``, llama4's ``freqs_cis``).
* ``upcast=True``: rotate in fp32 and return q's / k's dtypes (llama4's complex multiply, which the torch
  path computes as a complex product when the pairs are interleaved with one cos per pair); otherwise the
  result has ``promote_types(q.dtype, cos.dtype)`` as the HF functions do.

The PyTorch implementation computes what the family functions compute, op for op (bit-equal on CPU); the
Triton kernel rotates in fp32 and rounds once. Gradients flow to q and k, not to cos/sin (the families build
cos/sin from a buffer, without gradient).
"""

from __future__ import annotations

import torch

from .op import Op, register

try:
    from . import custom_ops_variants as _ops
except ImportError:  # pragma: no cover - no triton: torch only
    _ops = None


def rotary_dim_of(cos: torch.Tensor, cos_per_pair: bool) -> int:
    return cos.shape[-1] * (2 if cos_per_pair else 1)


def check_variant_shapes(q, k, cos, sin, cos_per_pair: bool) -> int:
    """Validate the shapes; return the rotary dim."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"rope: q and k must be [batch, heads, seq, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if cos.shape != sin.shape or cos.dim() != 3:
        raise ValueError(
            f"rope: cos and sin must be [batch or 1, seq, C]; got {tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(f"rope: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, seq or head_dim")
    rot = rotary_dim_of(cos, cos_per_pair)
    if cos.shape[0] not in (1, b) or cos.shape[1] != s:
        raise ValueError(f"rope: cos {tuple(cos.shape)} does not match q {tuple(q.shape)}")
    if rot % 2 or rot == 0 or rot > d:
        raise ValueError(f"rope: rotary dim {rot} (from cos {tuple(cos.shape)}) must be even and in (0, {d}]")
    return rot


def _complex_product(xr, cos, sin):
    """llama4's complex product in its own layout, [batch, seq, heads, pairs]: the CPU complex kernels round
    differently per memory layout, and this is the layout llama4 multiplies in (bit-equal)."""
    xs = xr.transpose(1, 2)
    xc = torch.view_as_complex(xs.reshape(*xs.shape[:-1], xs.shape[-1] // 2, 2))
    freqs = torch.complex(cos, sin).transpose(1, 2)
    return torch.view_as_real(xc * freqs).flatten(-2).transpose(1, 2)


def _rotate_torch(x, cos, sin, rot: int, interleaved: bool, cos_per_pair: bool, upcast: bool):
    half = rot // 2
    xr, xp = x[..., :rot], x[..., rot:]
    if upcast:
        xr, cos, sin = xr.float(), cos.float(), sin.float()
        if interleaved and cos_per_pair:
            y = _complex_product(xr, cos, sin).to(x.dtype)
            return torch.cat((y, xp), -1) if xp.shape[-1] else y
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    c1, s1 = cos[..., :half], sin[..., :half]
    c2, s2 = (c1, s1) if cos_per_pair else (cos[..., half:], sin[..., half:])
    y1 = x1 * c1 - x2 * s1
    y2 = x2 * c2 + x1 * s2
    y = torch.stack((y1, y2), -1).flatten(-2) if interleaved else torch.cat((y1, y2), -1)
    if upcast:
        y = y.to(x.dtype)
    return torch.cat((y, xp), -1) if xp.shape[-1] else y


def rope_variant_torch(
    q, k, cos, sin, interleaved: bool = False, cos_per_pair: bool = False, upcast: bool = False
):
    """PyTorch implementation (autograd by torch); see the module docstring for the options."""
    rot = check_variant_shapes(q, k, cos, sin, cos_per_pair)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return tuple(_rotate_torch(x, cos, sin, rot, interleaved, cos_per_pair, upcast) for x in (q, k))


def _out_dtypes(q, k, cos, upcast: bool):
    if upcast:
        return q.dtype, k.dtype
    return torch.promote_types(q.dtype, cos.dtype), torch.promote_types(k.dtype, cos.dtype)


class RopeVariantFunction(torch.autograd.Function):
    """Triton forward and backward (the transposed rotation) of the rope variants."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, interleaved: bool, cos_per_pair: bool, upcast: bool):
        rot = rotary_dim_of(cos, cos_per_pair)
        qd, kd = _out_dtypes(q, k, cos, upcast)
        ctx.save_for_backward(cos, sin)
        ctx.opts = (rot, interleaved, cos_per_pair)
        ctx.dtypes = (q.dtype, k.dtype)
        ctx.shapes = (q.shape, k.shape)
        ctx.set_materialize_grads(False)
        return _ops.rope_variant(q, k, cos, sin, *ctx.opts, qd, kd, False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        if dq is None:
            dq = cos.new_zeros(ctx.shapes[0], dtype=ctx.dtypes[0])
        if dk is None:
            dk = cos.new_zeros(ctx.shapes[1], dtype=ctx.dtypes[1])
        gq, gk = _ops.rope_variant(dq, dk, cos, sin, *ctx.opts, *ctx.dtypes, True)
        return gq, gk, None, None, None, None, None


def rope_variant_triton(q, k, cos, sin, interleaved=False, cos_per_pair=False, upcast=False):
    return RopeVariantFunction.apply(q, k, cos, sin, interleaved, cos_per_pair, upcast)


ROPE_VARIANT = register(
    Op("rope_variant", torch_impl=rope_variant_torch, triton_impl=rope_variant_triton if _ops else None)
)


def rope_variant(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    cos_per_pair: bool = False,
    upcast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k [batch, heads, seq, head_dim] (any strides, e.g. a transposed
    [batch, seq, heads, head_dim] view) by cos/sin [batch or 1, seq, C], in one of the layouts of the module
    docstring. Returns ``(q_out, k_out)``."""
    check_variant_shapes(q, k, cos, sin, cos_per_pair)
    return ROPE_VARIANT(q, k, cos, sin, interleaved, cos_per_pair, upcast)
