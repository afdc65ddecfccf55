"""PyTorch RoPE: the production CPU path (and the test reference). The norm and GLU ones are in ``kernels.norm``
and ``kernels.glu`` (``torch_math``)."""

from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def check_rope_shapes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"rope: q and k must be [batch, heads, seq, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if cos.shape != sin.shape or cos.dim() != 3:
        raise ValueError(
            f"rope: cos and sin must be [batch or 1, seq, head_dim]; got {tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    b, _, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d:
        raise ValueError(f"rope: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, seq or head_dim")
    if cos.shape[0] not in (1, b) or cos.shape[1] != s or cos.shape[2] != d:
        raise ValueError(f"rope: cos {tuple(cos.shape)} does not match q {tuple(q.shape)}")
    if d % 2:
        raise ValueError(f"rope: head_dim must be even, got {d}")


def rope_torch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding, rotate_half convention; identical to HF ``apply_rotary_pos_emb(unsqueeze_dim=1)``."""
    check_rope_shapes(q, k, cos, sin)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def rope_bwd_torch(dq, dk, cos, sin):
    """Transpose of the rotation: with halves (1, 2), dx1 = dy1*c1 + dy2*s2, dx2 = dy2*c2 - dy1*s1."""
    cos = cos.unsqueeze(1).float()
    sin = sin.unsqueeze(1).float()
    half = cos.shape[-1] // 2

    def back(dy):
        d = dy.float()
        d1, d2 = d[..., :half], d[..., half:]
        c1, c2, s1, s2 = cos[..., :half], cos[..., half:], sin[..., :half], sin[..., half:]
        return torch.cat((d1 * c1 + d2 * s2, d2 * c2 - d1 * s1), -1).to(dy.dtype)

    return back(dq), back(dk)
