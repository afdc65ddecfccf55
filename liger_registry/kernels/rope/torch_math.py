"""RoPE in PyTorch: the production CPU path of every layout, the reference of the tests, and the custom ops'
``torch`` backend (the rotation and its transpose in the layout and dtypes the Triton kernel writes)."""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_kernels import rope_out_like


def rotary_dim_of(cos: Tensor, cos_per_pair: bool) -> int:
    return cos.shape[-1] * (2 if cos_per_pair else 1)


def check_variant_shapes(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, cos_per_pair: bool) -> int:
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


def check_rope_shapes(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> None:
    """The plain layout: rotate-half over the whole head (cos/sin [batch or 1, seq, head_dim])."""
    if check_variant_shapes(q, k, cos, sin, cos_per_pair=False) != q.shape[-1]:
        raise ValueError(f"rope: cos {tuple(cos.shape)} does not match q {tuple(q.shape)}")


def out_dtypes(q: Tensor, k: Tensor, cos: Tensor, keep: bool) -> tuple[torch.dtype, torch.dtype]:
    """q's / k's dtypes when ``keep`` (fp32 math, a backward), else ``promote_types(x, cos)`` as HF's functions."""
    if keep:
        return q.dtype, k.dtype
    return torch.promote_types(q.dtype, cos.dtype), torch.promote_types(k.dtype, cos.dtype)


def _pairs(
    x: Tensor, cos: Tensor, sin: Tensor, rot: int, interleaved: bool, cos_per_pair: bool, transpose=False
):
    """The rotation of x's first ``rot`` dims (``transpose``: its transpose, the backward), the rest passed."""
    half = rot // 2
    xr, xp = x[..., :rot], x[..., rot:]
    x1, x2 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :half], xr[..., half:])
    c1, s1 = cos[..., :half], sin[..., :half]
    c2, s2 = (c1, s1) if cos_per_pair else (cos[..., half:], sin[..., half:])
    if transpose:
        y1, y2 = x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
    else:
        y1, y2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
    y = torch.stack((y1, y2), -1).flatten(-2) if interleaved else torch.cat((y1, y2), -1)
    return torch.cat((y, xp), -1) if xp.shape[-1] else y


def _complex_product(xr: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """llama4's complex product in its own layout, [batch, seq, heads, pairs]: the CPU complex kernels round
    differently per memory layout, and this is the layout llama4 multiplies in (bit-equal)."""
    xs = xr.transpose(1, 2)
    xc = torch.view_as_complex(xs.reshape(*xs.shape[:-1], xs.shape[-1] // 2, 2))
    freqs = torch.complex(cos, sin).transpose(1, 2)
    return torch.view_as_real(xc * freqs).flatten(-2).transpose(1, 2)


def _rotate_family(
    x: Tensor, cos: Tensor, sin: Tensor, rot: int, interleaved: bool, cos_per_pair: bool, upcast
):
    """What the family functions compute, op for op (bit-equal on CPU)."""
    if not upcast:
        return _pairs(x, cos, sin, rot, interleaved, cos_per_pair)
    if interleaved and cos_per_pair:
        y = _complex_product(x[..., :rot].float(), cos.float(), sin.float()).to(x.dtype)
        return torch.cat((y, x[..., rot:]), -1) if rot < x.shape[-1] else y
    return _pairs(x.float(), cos.float(), sin.float(), rot, interleaved, cos_per_pair).to(x.dtype)


def rope_variant_torch(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved=False, cos_per_pair=False, upcast=False
) -> tuple[Tensor, Tensor]:
    """PyTorch implementation (autograd by torch); see the package docstring for the options."""
    rot = check_variant_shapes(q, k, cos, sin, cos_per_pair)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return tuple(_rotate_family(x, cos, sin, rot, interleaved, cos_per_pair, upcast) for x in (q, k))


def rope_torch(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary embedding, rotate_half convention; identical to HF ``apply_rotary_pos_emb(unsqueeze_dim=1)``."""
    check_rope_shapes(q, k, cos, sin)
    return rope_variant_torch(q, k, cos, sin)


def _in_rope_layout(result: Tensor, x: Tensor) -> Tensor:
    out = rope_out_like(x, result.dtype)
    return result if out.stride() == result.stride() else out.copy_(result)


def _rotate_one(x, cos, sin, rot, interleaved, cos_per_pair, dtype, backward) -> Tensor:
    xm = x
    if backward or dtype != torch.promote_types(x.dtype, cos.dtype):  # as the kernel: fp32, rounded once
        xm, cos, sin = x.float(), cos.float(), sin.float()
    y = _pairs(xm, cos, sin, rot, interleaved, cos_per_pair, transpose=backward)
    return _in_rope_layout(y.to(dtype), x)


def rotate(
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
    """The Triton kernel's contract in PyTorch: results in ``q_dtype`` / ``k_dtype`` and q's / k's layout;
    in the promoted dtype (the HF formula) when that is the result's dtype, else in fp32."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    opts = (rotary_dim, interleaved, cos_per_pair)
    return _rotate_one(q, cos, sin, *opts, q_dtype, backward), _rotate_one(
        k, cos, sin, *opts, k_dtype, backward
    )
