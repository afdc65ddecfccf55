"""Triton cross entropy over rows of logits: the row statistics and gradient passes CE and FLCE share, and CE's
rows kernel (loss, lse, argmax and the gradient of a logits chunk in one launch).

* ``row_stats``: softmax statistics of one row (max, sum of exp(z - max), smoothing sum, argmax) in one pass over
  its columns, run as blocks (a running (max, sum) per row, merged per column block by two block-wide reductions)
  or as lanes (a running (max, sum) per lane, ``lse_lanes_update``, reduced once at the end: no reductions in the
  loop, three live vectors per thread, so a smaller block); ``ROW_STATS`` holds each kernel's choice and block
  cap (the measurements behind them: docs/design/ce-row-stats.md).
* ``grad_row``: the gradient pass of one row.
* ``ce_rows_triton``: CE's rows kernel; ``ce_rows_for`` picks it or ``reference.ce_rows_torch`` for a decided
  backend, ``row_scales`` packs its gradient scales once per call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .. import triton_utils as tu
from ..triton_utils import tanh
from .reference import ce_rows_torch

# How the row kernels run their statistics pass (``row_stats``): per-lane state ("lanes") or block reductions
# ("blocks"), and the largest column block. Lanes keep three live vectors per thread (32768 spills).
ROW_STATS = {"ce_rows": ("blocks", 8192), "vocab_stats": ("lanes", 2048)}
# Whether the CE rows kernel walks its gradient pass from the row's last column block to its first. The statistics
# pass has just streamed the row first to last, so its last blocks are the likeliest still in L2: rows of a 128k
# vocabulary (256 KB each), hundreds in flight, do not fit L2, and a first-to-last re-read meets the blocks in the
# order L2 evicted them. Off until timed against the forward order (``python -m benchmarks.probes.row_stats
# --grad-reversed``).
GRAD_REVERSED = False


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
    REVERSED: tl.constexpr = False,
):
    """Writes to ``g_ptr`` the gradient of the row at ``x_ptr``: ``(softmax(z) * coef - a_s [at target_col] -
    sm * class weight) * dz/dx`` with z = softcap(x * logit_scale); ``cw_ptr``: the class weights of its columns.
    ``REVERSED``: the column blocks last to first (the same values; see ``GRAD_REVERSED``)."""
    offs = tl.arange(0, BLOCK)
    last = (tl.cdiv(n_cols, BLOCK) - 1) * BLOCK
    for start in range(0, n_cols, BLOCK):
        first = start
        if REVERSED:
            first = last - start
        cols = first + offs
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


@triton.jit
def _ce_rows_kernel(
    X,
    stride_x,
    G,
    stride_g,
    Y,
    CE_OUT,
    Z_OUT,
    AM_OUT,
    ROWG,
    CW,
    SCALES,  # fp32 [3]: ce grad scale, z grad scale, sum of class weights
    ZYX,  # fp32 [N]: exact target logits (HAS_ZYX)
    n_cols,
    ignore_index,
    eps,
    softcap,
    logit_scale,
    lse_sq,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_ROWG: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    HAS_Z: tl.constexpr,
    ARGMAX: tl.constexpr,  # 0: none, 1: valid rows, 2: every row
    HAS_ZYX: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK: tl.constexpr,
    REVERSED: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_ptr = X + row * stride_x
    g_ptr = G + row * stride_g
    y = tl.load(Y + row)
    valid = y != ignore_index
    offs = tl.arange(0, BLOCK)
    if not valid:
        tl.store(CE_OUT + row, 0.0)
        if HAS_Z:
            tl.store(Z_OUT + row, 0.0)
        if ARGMAX < 2:
            if COMPUTE_GRAD:
                for start in range(0, n_cols, BLOCK):
                    cols = start + offs
                    tl.store(g_ptr + cols, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=cols < n_cols)
            return
    # pass 1: max / sum-exp (+ smoothing sums, argmax)
    m, d, sz, best, best_i = row_stats(
        x_ptr, CW, n_cols, softcap, logit_scale, HAS_SOFTCAP, HAS_WEIGHT, HAS_SMOOTH, ARGMAX > 0, LANES, BLOCK
    )
    if ARGMAX > 0:
        tl.store(AM_OUT + row, best_i.to(tl.int64))
    if not valid:
        if COMPUTE_GRAD:
            for start in range(0, n_cols, BLOCK):
                cols = start + offs
                tl.store(g_ptr + cols, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=cols < n_cols)
        return
    zy = tl.load(x_ptr + y).to(tl.float32) * logit_scale
    if HAS_SOFTCAP:
        zy = softcap * tanh(zy / softcap)
    if HAS_ZYX:  # the target's term of the sum-exp, exact
        zyx = tl.load(ZYX + row)
        d = d - tl.exp(zy - m) + tl.exp(zyx - m)
        zy = zyx
    lse = m + tl.log(d)
    if HAS_WEIGHT:
        wy = tl.load(CW + y).to(tl.float32)
        w_sum = tl.load(SCALES + 2)
    else:
        wy = 1.0
        w_sum = n_cols * 1.0
    ce = (lse - zy) * wy
    if HAS_SMOOTH:
        if HAS_WEIGHT:
            smooth = (w_sum * lse - sz) / n_cols
        else:
            smooth = lse - sz / n_cols
        ce = (1.0 - eps) * ce + eps * smooth
    tl.store(CE_OUT + row, ce)
    if HAS_Z:
        tl.store(Z_OUT + row, lse_sq * lse * lse)
    if COMPUTE_GRAD:
        ce_s = tl.load(SCALES + 0)
        z_s = tl.load(SCALES + 1)
        rg = 1.0
        if HAS_ROWG:
            rg = tl.load(ROWG + row).to(tl.float32)
        a = (1.0 - eps) * wy
        coef = (a + eps * w_sum / n_cols) * ce_s + 2.0 * lse_sq * lse * z_s
        coef = coef * rg
        a_s = a * ce_s * rg
        y32 = y.to(tl.int32)
        sm = eps / n_cols * ce_s * rg
        grad_row(
            x_ptr,
            g_ptr,
            CW,
            n_cols,
            y32,
            lse,
            coef,
            a_s,
            sm,
            softcap,
            logit_scale,
            HAS_SOFTCAP,
            HAS_WEIGHT,
            HAS_SMOOTH,
            BLOCK,
            REVERSED,
        )


def make_scales(ce_grad_scale, z_grad_scale, class_weights, device):
    def as_t(v):
        if isinstance(v, torch.Tensor):
            return v.to(device=device, dtype=torch.float32).reshape(())
        return torch.tensor(float(v), dtype=torch.float32, device=device)

    w_sum = (
        class_weights.to(torch.float32).sum().reshape(())
        if class_weights is not None
        else torch.zeros((), dtype=torch.float32, device=device)
    )
    return torch.stack([as_t(ce_grad_scale), as_t(z_grad_scale), w_sum])


@torch.no_grad()
def ce_rows_triton(
    buf: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    logit_scale: float,
    lse_square_scale: float,
    class_weights: torch.Tensor | None,
    ce_grad_scale,
    z_grad_scale,
    row_grad: torch.Tensor | None,
    compute_grad: bool,
    argmax_mode: int = 2,
    scales: torch.Tensor | None = None,
    out: tuple | None = None,
    grad_out: torch.Tensor | None = None,
    target_logit: torch.Tensor | None = None,
):
    """Same contract as :func:`reference.ce_rows_torch`; ``buf`` must have unit column stride.

    ``scales`` (fp32 [3], from :func:`make_scales`) and ``out`` (ce, z, argmax row buffers) let a caller that
    loops over chunks avoid small per-chunk allocations; ``grad_out`` receives the gradient instead of ``buf``.
    """
    n, v = buf.shape
    if buf.stride(1) != 1:
        raise ValueError("ce_rows_triton: logits buffer must have unit column stride")
    device = buf.device
    if out is None:
        ce = torch.empty(n, dtype=torch.float32, device=device)
        zl = torch.empty(n, dtype=torch.float32, device=device)
        am = torch.zeros(n, dtype=torch.long, device=device) if argmax_mode else ce
    else:
        ce, zl, am = out
    has_z = zl is not None
    zl = zl if has_z else ce
    am = am if am is not None else ce
    if n == 0:
        return ce, zl, am
    g = buf if grad_out is None else grad_out
    if g.stride(1) != 1 or g.shape != buf.shape:
        raise ValueError("ce_rows_triton: grad_out must match the logits and have unit column stride")
    if target.stride(0) != 1:
        target = target.contiguous()
    cw = class_weights.contiguous() if class_weights is not None else ce
    rg = row_grad.contiguous() if row_grad is not None else ce
    if scales is None:
        scales = make_scales(ce_grad_scale, z_grad_scale, class_weights, device)
    lanes, block = row_stats_config("ce_rows", v)
    _ce_rows_kernel[(n,)](
        buf,
        buf.stride(0),
        g,
        g.stride(0),
        target,
        ce,
        zl,
        am,
        rg,
        cw,
        scales,
        target_logit if target_logit is not None else ce,
        v,
        ignore_index,
        float(label_smoothing),
        float(softcap) if softcap is not None else 1.0,
        float(logit_scale),
        float(lse_square_scale),
        HAS_SOFTCAP=softcap is not None,
        HAS_WEIGHT=class_weights is not None,
        HAS_ROWG=row_grad is not None,
        HAS_SMOOTH=float(label_smoothing) > 0.0,
        HAS_Z=has_z,
        ARGMAX=int(argmax_mode),
        HAS_ZYX=target_logit is not None,
        COMPUTE_GRAD=bool(compute_grad),
        LANES=lanes,
        BLOCK=block,
        REVERSED=GRAD_REVERSED,
        num_warps=tu.warps_for(block),
    )
    return ce, zl, am


def ce_rows_for(backend: str) -> Callable:
    """The row kernel for an already decided backend (``"triton"`` or ``"torch"``)."""
    return ce_rows_triton if backend == "triton" else ce_rows_torch


def row_scales(backend: str, ce_scale, z_scale, class_weights, device) -> dict:
    """Extra keyword of the Triton row kernel: its gradient scales packed once per call, not once per chunk."""
    if backend != "triton":
        return {}
    return {"scales": make_scales(ce_scale, z_scale, class_weights, device)}
