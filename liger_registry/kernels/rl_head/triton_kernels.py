"""Triton kernels of the RL head: the one-pass fold of a logits tile into the per-token statistics, and the
in-place logits gradient of a tile; with their launchers.

* ``fold_tile_triton``: one program per token walks the tile's columns with per-lane online state (max, sum of
  exp, sum of exp * z, sum of exp^2, sum of z, first argmax; one exp per element, ``ce.triton_kernels``' lanes
  scheme), reduces it once and merges it into the token's running state; the program holding the target's column
  stores its ``z``. Same contract as ``reference.fold_tile_torch``.
* ``grad_tile_triton``: a (token, column block) grid overwriting the tile with d loss / d raw logits. Same
  contract as ``reference.grad_tile_torch``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import triton_utils as tu
from ..ce.triton_kernels import LANES_M0
from ..triton_utils import tanh
from .stats import Flags, RowState

# Column block caps. The fold keeps six vectors per lane (five fp32, one int32), so its block stays small enough
# not to spill; the gradient kernel is elementwise over a 2-D grid.
FOLD_BLOCK = 1024
GRAD_BLOCK = 1024


@triton.jit
def _z(x, softcap, scale, HAS_SOFTCAP: tl.constexpr):
    y = x * scale
    if HAS_SOFTCAP:
        y = softcap * tanh(y / softcap)
    return y


@triton.jit
def _merge(ptr, row, a, b, part):
    """The running sum at ``ptr[row]`` times ``a`` plus this tile's ``part`` times ``b`` (both rescaled to the
    new max)."""
    tl.store(ptr + row, tl.load(ptr + row) * a + part * b)


@triton.jit
def _fold_kernel(
    X,
    stride_x,
    Y,
    M,
    D,
    XS,
    SQ,
    ZS,
    ARG,
    ZT,
    col0,
    n_cols,
    softcap,
    scale,
    HAS_SOFTCAP: tl.constexpr,
    ENTROPY: tl.constexpr,
    SQUARES: tl.constexpr,
    MEAN: tl.constexpr,
    TOP1: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_ptr = X + row * stride_x
    offs = tl.arange(0, BLOCK)
    m_v = tl.full([BLOCK], LANES_M0, tl.float32)
    d_v = tl.zeros([BLOCK], tl.float32)
    xs_v = tl.zeros([BLOCK], tl.float32)
    sq_v = tl.zeros([BLOCK], tl.float32)
    zs_v = tl.zeros([BLOCK], tl.float32)
    i_v = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        z = _z(tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32), softcap, scale, HAS_SOFTCAP)
        z = tl.where(mask, z, 0.0)
        diff = tl.where(mask, z - m_v, float("-inf"))
        e = tl.exp(-tl.abs(diff))  # exp(z - m) below the lane's max, exp(m - z) above it; 0 where masked
        up = diff > 0
        d_v = tl.where(up, d_v * e + 1.0, d_v + e)
        if ENTROPY:
            xs_v = tl.where(up, xs_v * e + z, xs_v + e * z)
        if SQUARES:
            sq_v = tl.where(up, sq_v * e * e + 1.0, sq_v + e * e)
        if MEAN:
            zs_v += z
        if TOP1:
            i_v = tl.where(up, cols, i_v)
        m_v = tl.where(up, z, m_v)
    mx = tl.max(m_v, 0)
    s_v = tl.exp(m_v - mx)
    m0 = tl.load(M + row)
    new_m = tl.maximum(m0, mx)
    a = tl.exp(m0 - new_m)
    b = tl.exp(mx - new_m)
    _merge(D, row, a, b, tl.sum(d_v * s_v, 0))
    if ENTROPY:
        _merge(XS, row, a, b, tl.sum(xs_v * s_v, 0))
    if SQUARES:
        _merge(SQ, row, a * a, b * b, tl.sum(sq_v * s_v * s_v, 0))
    if MEAN:
        tl.store(ZS + row, tl.load(ZS + row) + tl.sum(zs_v, 0))
    if TOP1:
        first = tl.min(tl.where(m_v == mx, i_v, n_cols), 0)
        if mx > m0:  # strictly: an earlier tile keeps a tie
            tl.store(ARG + row, (col0 + first).to(tl.int64))
    tl.store(M + row, new_m)
    local = tl.load(Y + row) - col0
    if (local >= 0) & (local < n_cols):
        tl.store(ZT + row, _z(tl.load(x_ptr + local).to(tl.float32), softcap, scale, HAS_SOFTCAP))


@triton.jit
def _grad_kernel(
    X,
    stride_x,
    Y,
    LOG_Z,
    ENT,
    G_LP,
    G_ENT,
    col0,
    n_cols,
    softcap,
    scale,
    HAS_SOFTCAP: tl.constexpr,
    HAS_LP: tl.constexpr,
    HAS_ENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    ptrs = X + row * stride_x + cols
    y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32) * scale
    if HAS_SOFTCAP:
        t = tanh(y / softcap)
        z = softcap * t
    else:
        z = y
    log_p = z - tl.load(LOG_Z + row)
    p = tl.exp(log_p)
    g = tl.zeros([BLOCK], tl.float32)
    if HAS_LP:
        g_lp = tl.load(G_LP + row)
        g = tl.where(cols + col0 == tl.load(Y + row), g_lp, 0.0) - g_lp * p
    if HAS_ENT:
        g -= tl.load(G_ENT + row) * p * (log_p + tl.load(ENT + row))
    if HAS_SOFTCAP:
        g = g * (1.0 - t * t)
    tl.store(ptrs, (g * scale).to(X.dtype.element_ty), mask=mask)


@torch.no_grad()
def fold_tile_triton(tile, target, state: RowState, col0: int, softcap, scale, flags: Flags) -> None:
    """Same contract as :func:`reference.fold_tile_torch`."""
    n, c = tile.shape
    if n == 0:
        return
    block = tu.row_block(c, min(tu.MAX_BLOCK, FOLD_BLOCK))
    _fold_kernel[(n,)](
        tile,
        tile.stride(0),
        target,
        *state,
        col0,
        c,
        1.0 if softcap is None else float(softcap),
        float(scale),
        HAS_SOFTCAP=softcap is not None,
        ENTROPY=flags.entropy,
        SQUARES=flags.log_sum_sq_probs,
        MEAN=flags.mean_logits,
        TOP1=flags.is_top1,
        BLOCK=block,
        num_warps=tu.warps_for(block),
    )


@torch.no_grad()
def grad_tile_triton(tile, target, log_z, entropy, g_lp, g_ent, col0: int, softcap, scale) -> None:
    """Same contract as :func:`reference.grad_tile_torch`."""
    n, c = tile.shape
    if n == 0:
        return
    block = tu.row_block(c, min(tu.MAX_BLOCK, GRAD_BLOCK))
    _grad_kernel[(n, tu.cdiv(c, block))](
        tile,
        tile.stride(0),
        target,
        log_z,
        log_z if entropy is None else entropy,
        log_z if g_lp is None else g_lp,
        log_z if g_ent is None else g_ent,
        col0,
        c,
        1.0 if softcap is None else float(softcap),
        float(scale),
        HAS_SOFTCAP=softcap is not None,
        HAS_LP=g_lp is not None,
        HAS_ENT=g_ent is not None,
        BLOCK=block,
        num_warps=tu.warps_for(block),
    )
