"""RoPE in PyTorch, every layout: the twin of the Triton kernel.

* ``rope_torch`` / ``rope_variant_torch``: the CPU path and the tests' reference (the family functions, op for
  op).
* ``rotate_torch``: the custom ops' ``torch`` backend, the rotation and its transpose in the layout and dtypes
  the Triton kernel writes.
* The layout helpers (``plain_layout``, ``rope_table``, ``out_dtypes``, the shape checks) shared with ``op``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .triton_kernels import rope_out_like


def rotary_dim_of(cos: Tensor, cos_per_pair: bool) -> int:
    return cos.shape[-1] * (2 if cos_per_pair else 1)


def cos_columns(rotary_dim: int, cos_per_pair: bool) -> int:
    """The columns of cos/sin a rotation reads: one per rotated dim, or one per pair."""
    return rotary_dim // 2 if cos_per_pair else rotary_dim


def plain_layout(head_dim: int, cos_width: int) -> tuple[int, bool]:
    """``(rotary_dim, cos_per_pair)`` of the plain op: HF's rotate-half, one cos per dim, when cos is exactly
    head_dim wide (even); otherwise liger-kernel's rope contract: pairs (j, j + head_dim // 2) each rotated by
    ``cos[..., j]`` (the table's first head_dim // 2 columns, any wider table), an odd head_dim's last dim passed
    through. The two agree on HF's tables, whose halves are equal."""
    if cos_width == head_dim and head_dim % 2 == 0:
        return head_dim, False
    return 2 * (head_dim // 2), True


def rope_table(cos: Tensor, sin: Tensor, rotary_dim: int, cos_per_pair: bool) -> tuple[Tensor, Tensor]:
    """cos/sin as [batch or 1, seq, the columns the rotation reads] views: a 2-D [seq, C] table (the vision
    towers') broadcasts over the batch, a wider one's extra columns are not read."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cols = cos_columns(rotary_dim, cos_per_pair)
    return cos[..., :cols], sin[..., :cols]


def check_variant_shapes(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, cos_per_pair: bool, rotary_dim: int | None = None
) -> int:
    """Validate the shapes; return the rotary dim (``rotary_dim``, or the one cos's width gives)."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"rope: q and k must be [batch, heads, seq, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if cos.shape != sin.shape or cos.dim() not in (2, 3):
        raise ValueError(
            f"rope: cos and sin must be [batch or 1, seq, C] or [seq, C]; got {tuple(cos.shape)}, "
            f"{tuple(sin.shape)}"
        )
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(f"rope: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, seq or head_dim")
    if cos.shape[-2] != s or (cos.dim() == 3 and cos.shape[0] not in (1, b)):
        raise ValueError(f"rope: cos {tuple(cos.shape)} does not match q {tuple(q.shape)}")
    rot = rotary_dim_of(cos, cos_per_pair) if rotary_dim is None else rotary_dim
    if isinstance(rot, bool) or not isinstance(rot, int) or rot % 2 or rot <= 0 or rot > d:
        raise ValueError(f"rope: rotary dim {rot!r} must be an even int in (0, {d}]")
    if cos_columns(rot, cos_per_pair) > cos.shape[-1]:
        raise ValueError(f"rope: cos {tuple(cos.shape)} is narrower than rotary dim {rot} needs")
    return rot


def check_rope_shapes(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[int, bool]:
    """The plain op's shapes (:func:`plain_layout`); returns its ``(rotary_dim, cos_per_pair)``."""
    rot, per_pair = plain_layout(q.shape[-1], cos.shape[-1]) if q.dim() == 4 else (0, False)
    check_variant_shapes(q, k, cos, sin, per_pair, rot)
    return rot, per_pair


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


def _rotate_both(q, k, cos, sin, rot: int, interleaved: bool, cos_per_pair: bool, upcast: bool):
    cos, sin = rope_table(cos, sin, rot, cos_per_pair)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return tuple(_rotate_family(x, cos, sin, rot, interleaved, cos_per_pair, upcast) for x in (q, k))


def rope_variant_torch(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved=False,
    cos_per_pair=False,
    upcast=False,
    rotary_dim=None,
) -> tuple[Tensor, Tensor]:
    """PyTorch implementation (autograd by torch); see the package docstring for the options."""
    rot = check_variant_shapes(q, k, cos, sin, cos_per_pair, rotary_dim)
    return _rotate_both(q, k, cos, sin, rot, interleaved, cos_per_pair, upcast)


def rope_torch(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary embedding, rotate_half convention; identical to HF ``apply_rotary_pos_emb(unsqueeze_dim=1)`` for
    its [batch or 1, seq, head_dim] tables, liger-kernel's rope for the others (:func:`plain_layout`)."""
    rot, per_pair = check_rope_shapes(q, k, cos, sin)
    return _rotate_both(q, k, cos, sin, rot, False, per_pair, False)


def _in_rope_layout(result: Tensor, x: Tensor) -> Tensor:
    out = rope_out_like(x, result.dtype)
    return result if out.stride() == result.stride() else out.copy_(result)


def _rotate_one(x, cos, sin, rot, interleaved, cos_per_pair, dtype, backward) -> Tensor:
    xm = x
    if backward or dtype != torch.promote_types(x.dtype, cos.dtype):  # as the kernel: fp32, rounded once
        xm, cos, sin = x.float(), cos.float(), sin.float()
    y = _pairs(xm, cos, sin, rot, interleaved, cos_per_pair, transpose=backward)
    return _in_rope_layout(y.to(dtype), x)


def rotate_torch(
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
    in the promoted dtype (the HF formula) when that is the result's dtype, else in fp32. cos/sin as
    :func:`rope_table` gives them."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    opts = (rotary_dim, interleaved, cos_per_pair)
    return _rotate_one(q, cos, sin, *opts, q_dtype, backward), _rotate_one(
        k, cos, sin, *opts, k_dtype, backward
    )
