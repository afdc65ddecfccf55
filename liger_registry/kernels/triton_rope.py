"""Triton RoPE (rotate_half convention, HF layout): q and k of one (batch, position) in one program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src_row,
    src_h,
    dst_row,
    dst_h,
    n_heads,
    d,
    dmask,
    c1,
    c2,
    s1,
    s2,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    """Rotate every head of one (batch, position) row; the backward applies the transposed rotation."""
    h = tl.arange(0, BLOCK_H)
    m = (h[:, None] < n_heads) & dmask[None, :]
    src = src_row + h[:, None] * src_h + d[None, :]
    x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * c1[None, :] + x2 * s2[None, :]
        y2 = x2 * c2[None, :] - x1 * s1[None, :]
    else:
        y1 = x1 * c1[None, :] - x2 * s1[None, :]
        y2 = x2 * c2[None, :] + x1 * s2[None, :]
    dst = dst_row + h[:, None] * dst_h + d[None, :]
    tl.store(dst, y1.to(dst_row.dtype.element_ty), mask=m)
    tl.store(dst + HALF, y2.to(dst_row.dtype.element_ty), mask=m)


@triton.jit
def _rope_kernel(
    Q,
    sqb,
    sqh,
    sqs,
    K,
    skb,
    skh,
    sks,
    QO,
    sob,
    soh,
    sos,
    KO,
    stb,
    sth,
    sts,
    COS,
    SIN,
    scb,
    scs,
    seq_len,
    n_qh,
    n_kh,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    c_ptr = COS + b * scb + s * scs
    s_ptr = SIN + b * scb + s * scs
    c1 = tl.load(c_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    c2 = tl.load(c_ptr + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    s1 = tl.load(s_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    s2 = tl.load(s_ptr + HALF + d, mask=dmask, other=0.0).to(tl.float32)

    _rotate_heads(
        Q + b * sqb + s * sqs,
        sqh,
        QO + b * sob + s * sos,
        soh,
        n_qh,
        d,
        dmask,
        c1,
        c2,
        s1,
        s2,
        HALF,
        BLOCK_QH,
        BACKWARD,
    )
    _rotate_heads(
        K + b * skb + s * sks,
        skh,
        KO + b * stb + s * sts,
        sth,
        n_kh,
        d,
        dmask,
        c1,
        c2,
        s1,
        s2,
        HALF,
        BLOCK_KH,
        BACKWARD,
    )


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_apply(q, k, cos, sin, backward: bool = False):
    """Rotate q [B, Hq, S, D] and k [B, Hk, S, D] by cos/sin [B or 1, S, D]; ``backward`` applies the transpose."""
    q, k = _unit_last(q), _unit_last(k)
    cos, sin = cos.contiguous(), sin.contiguous()
    if cos.shape != sin.shape:
        raise ValueError("rope: cos and sin shapes differ")
    bsz, n_qh, seq, hd = q.shape
    n_kh = k.shape[1]
    out_q = torch.empty(q.shape, dtype=torch.promote_types(q.dtype, cos.dtype), device=q.device)
    out_k = torch.empty(k.shape, dtype=torch.promote_types(k.dtype, cos.dtype), device=k.device)
    if q.numel() == 0 and k.numel() == 0:
        return out_q, out_k
    half = hd // 2
    scb = cos.stride(0) if cos.shape[0] != 1 else 0
    block_d = triton.next_power_of_2(half)
    block_qh = triton.next_power_of_2(max(n_qh, 1))
    block_kh = triton.next_power_of_2(max(n_kh, 1))
    tile = (block_qh + block_kh) * block_d
    _rope_kernel[(bsz * seq,)](
        q,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k,
        k.stride(0),
        k.stride(1),
        k.stride(2),
        out_q,
        out_q.stride(0),
        out_q.stride(1),
        out_q.stride(2),
        out_k,
        out_k.stride(0),
        out_k.stride(1),
        out_k.stride(2),
        cos,
        sin,
        scb,
        cos.stride(1),
        seq,
        n_qh,
        n_kh,
        HALF=half,
        BLOCK_QH=block_qh,
        BLOCK_KH=block_kh,
        BLOCK_D=block_d,
        BACKWARD=backward,
        num_warps=8 if tile >= 4096 else 4,
    )
    return out_q, out_k
