"""Triton RoPE: one kernel for every layout and its launcher.

* ``launch_rotate``: rotate-half or interleaved pairs, partial rotary dim, one cos per element or per pair;
  ``backward`` applies the transposed rotation. Outputs in q's / k's layout (``rope_out_like``).
* q and k of one (batch, position) in one program (cos/sin loaded once); pass-through dims copied.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_rows(
    src_row,
    src_h,
    dst_row,
    dst_h,
    n_heads,
    pairs,
    HALF: tl.constexpr,
    ROT: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_PASS: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    """Rotate the pairs (and copy the pass-through dims) of every head of one (batch, position) row of q or k;
    ``pairs``: the pair and pass-through offsets with their masks, and the row's cos/sin halves."""
    i, imask, p, pmask, c1, c2, s1, s2 = pairs
    h = tl.arange(0, BLOCK_H)
    hmask = h[:, None] < n_heads
    m = hmask & imask[None, :]
    if INTERLEAVED:
        off1 = 2 * i
        off2 = 2 * i + 1
    else:
        off1 = i
        off2 = i + HALF
    src = src_row + h[:, None] * src_h
    x1 = tl.load(src + off1[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + off2[None, :], mask=m, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * c1[None, :] + x2 * s2[None, :]
        y2 = x2 * c2[None, :] - x1 * s1[None, :]
    else:
        y1 = x1 * c1[None, :] - x2 * s1[None, :]
        y2 = x2 * c2[None, :] + x1 * s2[None, :]
    dst = dst_row + h[:, None] * dst_h
    tl.store(dst + off1[None, :], y1.to(dst_row.dtype.element_ty), mask=m)
    tl.store(dst + off2[None, :], y2.to(dst_row.dtype.element_ty), mask=m)
    if HAS_PASS:
        mp = hmask & pmask[None, :]
        xp = tl.load(src + ROT + p[None, :], mask=mp, other=0.0)
        tl.store(dst + ROT + p[None, :], xp.to(dst_row.dtype.element_ty), mask=mp)


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
    scb,
    scs,
    SIN,
    ssb,
    sss,
    seq_len,
    n_qh,
    n_kh,
    n_pass,
    HALF: tl.constexpr,
    ROT: tl.constexpr,
    COS2: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HAS_PASS: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    i = tl.arange(0, BLOCK_I)
    imask = i < HALF
    p = tl.arange(0, BLOCK_P)
    pmask = p < n_pass
    c_ptr = COS + b * scb + s * scs
    s_ptr = SIN + b * ssb + s * sss
    c1 = tl.load(c_ptr + i, mask=imask, other=0.0).to(tl.float32)
    c2 = tl.load(c_ptr + COS2 + i, mask=imask, other=0.0).to(tl.float32)
    s1 = tl.load(s_ptr + i, mask=imask, other=0.0).to(tl.float32)
    s2 = tl.load(s_ptr + COS2 + i, mask=imask, other=0.0).to(tl.float32)
    pairs = (i, imask, p, pmask, c1, c2, s1, s2)
    _rotate_rows(
        Q + b * sqb + s * sqs,
        sqh,
        QO + b * sob + s * sos,
        soh,
        n_qh,
        pairs,
        HALF,
        ROT,
        INTERLEAVED,
        BLOCK_QH,
        HAS_PASS,
        BACKWARD,
    )
    _rotate_rows(
        K + b * skb + s * sks,
        skh,
        KO + b * stb + s * sts,
        sth,
        n_kh,
        pairs,
        HALF,
        ROT,
        INTERLEAVED,
        BLOCK_KH,
        HAS_PASS,
        BACKWARD,
    )


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_out_like(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The output of rotating ``x``: x's layout (a seq-first view stays seq-first; a non-dense one, e.g. q sliced
    from a fused qkv projection, gets the dense layout of the same dim order), contiguous when x's last dim is
    not unit-stride (the kernel reads a contiguous copy then). The torch branch of the ops writes the same."""
    if x.stride(-1) != 1:
        return torch.empty(x.shape, dtype=dtype, device=x.device)
    return torch.empty_like(x, dtype=dtype)


def _bstride(t: torch.Tensor) -> int:
    return t.stride(0) if t.shape[0] != 1 else 0


def launch_rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: int,
    interleaved: bool,
    cos_per_pair: bool,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype,
    backward: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [B, Hq, S, D] and k [B, Hk, S, D] (any strides, copied only if the last is not 1) by cos/sin
    [B or 1, S, C]; the first ``rotary_dim`` dims rotate, the rest pass through. Pair j uses ``cos[j]``
    (and ``cos[j + rotary_dim/2]`` for its second element unless ``cos_per_pair``). Results have q's / k's layout,
    in ``q_dtype`` / ``k_dtype``; ``backward`` applies the transposed rotation (q, k are the gradients)."""
    q, k, cos, sin = _unit_last(q), _unit_last(k), _unit_last(cos), _unit_last(sin)
    bsz, n_qh, seq, hd = q.shape
    n_kh = k.shape[1]
    out_q, out_k = rope_out_like(q, q_dtype), rope_out_like(k, k_dtype)
    if bsz * seq == 0 or (n_qh == 0 and n_kh == 0):
        return out_q, out_k
    half = rotary_dim // 2
    n_pass = hd - rotary_dim
    block_i = triton.next_power_of_2(half)
    block_qh = triton.next_power_of_2(max(n_qh, 1))
    block_kh = triton.next_power_of_2(max(n_kh, 1))
    block_p = triton.next_power_of_2(max(n_pass, 1))
    tile = (block_qh + block_kh) * (block_i + (block_p if n_pass else 0))
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
        _bstride(cos),
        cos.stride(1),
        sin,
        _bstride(sin),
        sin.stride(1),
        seq,
        n_qh,
        n_kh,
        n_pass,
        HALF=half,
        ROT=rotary_dim,
        COS2=0 if cos_per_pair else half,
        INTERLEAVED=interleaved,
        BLOCK_QH=block_qh,
        BLOCK_KH=block_kh,
        BLOCK_I=block_i,
        BLOCK_P=block_p,
        HAS_PASS=n_pass > 0,
        BACKWARD=backward,
        num_warps=8 if tile >= 4096 else 4,
    )
    return out_q, out_k
