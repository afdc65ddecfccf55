"""The Triton passes over one cross-entropy row that CE and FLCE share: the softmax statistics (max, sum of
exp(z - max), smoothing sum, argmax) in one pass over its columns, and the gradient pass (``grad_row``).

Two ways to run the statistics pass, chosen by the caller's constexpr ``LANES``:

* blocks: one running (max, sum) per row, merged with each column block by two block-wide reductions.
* lanes: a running (max, sum) per lane (``lse_lanes_update``), reduced once at the end: no
  reductions in the loop, but three live vectors per thread, so it needs a smaller block to stay in registers.

Which is faster depends on the kernel and its shapes (``benchmarks/probe_row_stats.py`` measures them; the figures
are in benchmarks/NOTES.md); ``ROW_STATS`` holds the choice per kernel and its block caps.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import triton_utils as tu
from ..triton_utils import tanh

# How the row kernels run their statistics pass (``row_stats``): per-lane state ("lanes") or block reductions
# ("blocks"), and the largest column block. Lanes keep three live vectors per thread (32768 spills).
ROW_STATS = {"ce_rows": ("blocks", 8192), "vocab_stats": ("lanes", 2048)}


def row_stats_config(kernel: str, n_cols: int) -> tuple[bool, int]:
    """``(lanes, block)`` of a row kernel's statistics pass (``ROW_STATS``), the block capped by MAX_BLOCK."""
    mode, cap = ROW_STATS[kernel]
    return mode == "lanes", tu.row_block(n_cols, min(tu.MAX_BLOCK, cap))


# Online log-sum-exp kept per lane: no block-wide reduction inside the column loop (two per block cost more
# than the memory traffic), one exp per element, reduced once per row. ``m`` starts at LANES_M0 (finite, so a
# lane that has only seen masked -inf columns adds exp(-inf) = 0 instead of exp(nan)).
LANES_M0 = tl.constexpr(-1.0e30)


@triton.jit
def lse_lanes_update(m, d, z):
    """Fold the block ``z`` (-inf where masked) into the per-lane running max ``m`` and sum ``d`` of exp(z - m)."""
    diff = z - m
    e = tl.exp(-tl.abs(diff))
    d = tl.where(diff > 0, d * e + 1.0, d + e)
    return tl.maximum(m, z), d


@triton.jit
def lse_lanes_finish(m, d):
    """The row's max and sum of exp(z - max) from the per-lane state."""
    mx = tl.max(m, 0)
    return mx, tl.sum(d * tl.exp(m - mx), 0)


@triton.jit
def argmax_lanes_update(best, best_i, z, cols):
    """Per-lane running max and its first column (strict >: the earliest column wins a tie)."""
    better = z > best
    return tl.where(better, z, best), tl.where(better, cols, best_i)


@triton.jit
def argmax_lanes_finish(best, best_i, n_cols):
    """The row's max and its first column (the smallest column among the lanes that hold the max)."""
    mx = tl.max(best, 0)
    return mx, tl.min(tl.where(best == mx, best_i, n_cols), 0)


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


@triton.jit
def grad_row(
    x_ptr,
    g_ptr,
    cw_ptr,
    n_cols,
    target_col,
    lse,
    coef,
    a_s,
    sm,
    softcap,
    logit_scale,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Writes to ``g_ptr`` the gradient of the row at ``x_ptr``: ``(softmax(z) * coef - a_s [at target_col] -
    sm * class weight) * dz/dx`` with z = softcap(x * logit_scale); ``cw_ptr``: the class weights of its columns."""
    offs = tl.arange(0, BLOCK)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        z = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32) * logit_scale
        if HAS_SOFTCAP:
            t = tanh(z / softcap)
            z = softcap * t
        g = tl.exp(z - lse) * coef
        g = tl.where(cols == target_col, g - a_s, g)
        if HAS_SMOOTH:
            if HAS_WEIGHT:
                g -= sm * tl.load(cw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            else:
                g -= sm
        if HAS_SOFTCAP:
            g = g * (1.0 - t * t)
        g = g * logit_scale
        tl.store(g_ptr + cols, g.to(g_ptr.dtype.element_ty), mask=mask)
