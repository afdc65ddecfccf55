"""A row's softmax statistics in one pass over its columns: max, sum of exp(z - max), smoothing sum, argmax.

Two ways to run the pass, chosen by the caller's constexpr ``LANES``:

* blocks: one running (max, sum) per row, merged with each column block by two block-wide reductions.
* lanes: a running (max, sum) per lane (``triton_utils.lse_lanes_update``), reduced once at the end: no
  reductions in the loop, but three live vectors per thread, so it needs a smaller block to stay in registers.

Which is faster depends on the kernel and its shapes (H200 run 13: the vocab strategy's statistics kernel runs
twice as fast with lanes, the CE rows kernel best with blocks of 8192); ``triton_utils.ROW_STATS`` holds the
choice per kernel and its block caps.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_utils import (
    LANES_M0,
    argmax_lanes_finish,
    argmax_lanes_update,
    lse_lanes_finish,
    lse_lanes_update,
    tanh,
)


@triton.jit
def _z(x_ptr, cols, mask, softcap, logit_scale, HAS_SOFTCAP: tl.constexpr):
    z = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32) * logit_scale
    if HAS_SOFTCAP:
        z = softcap * tanh(z / softcap)
    return tl.where(mask, z, float("-inf"))


@triton.jit
def _smooth_terms(z, mask, cw_ptr, cols, HAS_WEIGHT: tl.constexpr):
    zs = tl.where(mask, z, 0.0)
    if HAS_WEIGHT:
        zs = zs * tl.load(cw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return zs


@triton.jit
def row_stats(
    x_ptr,
    cw_ptr,
    n_cols,
    softcap,
    logit_scale,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    ARGMAX: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``(m, d, sz, best, best_i)`` of the row at ``x_ptr``: max, sum of exp(z - m), sum of z (times the class
    weights at ``cw_ptr``), and the max with its first column (when ``ARGMAX``); z = softcap(x * logit_scale)."""
    offs = tl.arange(0, BLOCK)
    if LANES:
        m_v = tl.full([BLOCK], LANES_M0, tl.float32)
        d_v = tl.zeros([BLOCK], tl.float32)
        sz_v = tl.zeros([BLOCK], tl.float32)
        best_v = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i_v = tl.zeros([BLOCK], tl.int32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            mask = cols < n_cols
            z = _z(x_ptr, cols, mask, softcap, logit_scale, HAS_SOFTCAP)
            if ARGMAX:
                best_v, best_i_v = argmax_lanes_update(best_v, best_i_v, z, cols)
            m_v, d_v = lse_lanes_update(m_v, d_v, z)
            if HAS_SMOOTH:
                sz_v += _smooth_terms(z, mask, cw_ptr, cols, HAS_WEIGHT)
        m, d = lse_lanes_finish(m_v, d_v)
        sz = tl.sum(sz_v, 0)
        best = float("-inf")
        best_i = 0
        if ARGMAX:
            best, best_i = argmax_lanes_finish(best_v, best_i_v, n_cols)
    else:
        m = float("-inf")
        d = 0.0
        sz = 0.0
        best = float("-inf")
        best_i = 0
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            mask = cols < n_cols
            z = _z(x_ptr, cols, mask, softcap, logit_scale, HAS_SOFTCAP)
            bm = tl.max(z, 0)
            if ARGMAX:
                bi = tl.argmax(z, 0)
                best_i = tl.where(bm > best, start + bi, best_i)
                best = tl.maximum(best, bm)
            m_new = tl.maximum(m, bm)
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
            m = m_new
            if HAS_SMOOTH:
                sz += tl.sum(_smooth_terms(z, mask, cw_ptr, cols, HAS_WEIGHT), 0)
    return m, d, sz, best, best_i
