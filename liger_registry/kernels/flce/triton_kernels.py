"""Triton kernels of the FLCE vocabulary strategy and their launchers.

* ``stats_update_triton``: row statistics of a vocabulary chunk; ``grad_inplace_triton``: its in-place gradient.
* Same contracts as ``reference.stats_update_torch`` / ``grad_inplace_torch``; one program per row.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import triton_utils as tu
from ..ce.triton_kernels import grad_row, row_stats, row_stats_config
from ..triton_utils import tanh
from .reference import RowCoefs, RowState


@triton.jit
def _stats_kernel(
    X,
    stride_x,
    Y,
    M,
    D,
    ZY,
    SZ,
    BEST,
    BEST_I,
    CW,
    n_cols,
    col0,
    softcap,
    logit_scale,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    ARGMAX: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_ptr = X + row * stride_x
    m_c, d_c, sz, best_c, best_ic = row_stats(
        x_ptr,
        CW + col0,
        n_cols,
        softcap,
        logit_scale,
        HAS_SOFTCAP,
        HAS_WEIGHT,
        HAS_SMOOTH,
        ARGMAX,
        LANES,
        BLOCK,
    )
    # this chunk's (max, sum) merged into the row's running state of the earlier chunks
    m_in = tl.load(M + row)
    m = tl.maximum(m_in, m_c)
    d = tl.load(D + row) * tl.exp(m_in - m) + d_c * tl.exp(m_c - m)
    if ARGMAX:
        best = tl.load(BEST + row)
        best_i = tl.where(best_c > best, col0 + best_ic.to(tl.int64), tl.load(BEST_I + row))
        best = tl.maximum(best, best_c)
    tl.store(M + row, m)
    tl.store(D + row, d)
    if HAS_SMOOTH:
        tl.store(SZ + row, tl.load(SZ + row) + sz)
    if ARGMAX:
        tl.store(BEST + row, best)
        tl.store(BEST_I + row, best_i)
    local = tl.load(Y + row) - col0
    if (local >= 0) & (local < n_cols):
        zy = tl.load(x_ptr + local).to(tl.float32) * logit_scale
        if HAS_SOFTCAP:
            zy = softcap * tanh(zy / softcap)
        tl.store(ZY + row, zy)


@triton.jit
def _grad_kernel(
    X,
    stride_x,
    Y,
    LSE,
    COEF,
    A_S,
    SM,
    CW,
    n_cols,
    col0,
    softcap,
    logit_scale,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_ptr = X + row * stride_x
    local = tl.load(Y + row) - col0
    grad_row(
        x_ptr,
        x_ptr,
        CW + col0,
        n_cols,
        local,
        tl.load(LSE + row),
        tl.load(COEF + row),
        tl.load(A_S + row),
        tl.load(SM + row),
        softcap,
        logit_scale,
        HAS_SOFTCAP,
        HAS_WEIGHT,
        HAS_SMOOTH,
        BLOCK,
    )


@functools.cache
def _flags(width: int, has_softcap: bool, has_weight: bool, has_smooth: bool, stats: bool) -> dict:
    """Launch constants of one chunk width and option set (made once: the loops launch these per chunk);
    ``stats``: those of the statistics kernel (``ROW_STATS["vocab_stats"]``), else the gradient kernel's."""
    flags = dict(HAS_SOFTCAP=has_softcap, HAS_WEIGHT=has_weight, HAS_SMOOTH=has_smooth)
    if stats:
        flags["LANES"], block = row_stats_config("vocab_stats", width)
    else:
        block = tu.row_block(width)
    return dict(flags, BLOCK=block, num_warps=tu.warps_for(block))


def _common(buf: torch.Tensor, opts, class_weights, stats: bool = False):
    if buf.stride(1) != 1:
        raise ValueError("the logits chunk must have unit column stride")
    flags = _flags(
        buf.shape[1], opts.softcap is not None, class_weights is not None, opts.label_smoothing > 0.0, stats
    )
    cw = class_weights if class_weights is not None else buf
    scalars = (float(opts.softcap) if opts.softcap is not None else 1.0, float(opts.logit_scale))
    return cw, scalars, flags


@torch.no_grad()
def stats_update_triton(
    buf, col0: int, target, state: RowState, *, opts, class_weights, argmax: bool
) -> None:
    n, width = buf.shape
    if n == 0:
        return
    cw, (softcap, scale), flags = _common(buf, opts, class_weights, stats=True)
    _stats_kernel[(n,)](
        buf, buf.stride(0), target, *state, cw, width, col0, softcap, scale, ARGMAX=bool(argmax), **flags
    )


@torch.no_grad()
def grad_inplace_triton(buf, col0: int, target, coefs: RowCoefs, *, opts, class_weights) -> None:
    n, width = buf.shape
    if n == 0:
        return
    cw, (softcap, scale), flags = _common(buf, opts, class_weights)
    _grad_kernel[(n,)](buf, buf.stride(0), target, *coefs, cw, width, col0, softcap, scale, **flags)
