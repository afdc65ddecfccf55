"""Triton RMSNorm, fused residual add + RMSNorm and LayerNorm: row kernels and their launchers.

* ``launch_rms_norm_fwd`` / ``launch_rms_norm_bwd``, ``launch_add_rms_norm_fwd`` / ``launch_add_rms_norm_bwd``,
  ``launch_layer_norm_fwd`` / ``launch_layer_norm_bwd``: fresh contiguous outputs plus the saved statistics
  (rstd, mean); RMSNorm and add + RMSNorm share one backward kernel.
* Casting modes llama / gemma / none, an offset, with or without a weight: without one (``HAS_W`` off) the
  normalised value is the output (no scale, no offset, no dw).
* Host time per call is part of the contract (docs/design/norm-host-overhead.md): launch constants are made once
  per width, and the weight (and bias) gradient partials are summed and cast by one kernel instead of a torch
  ``sum`` + ``to`` per parameter.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import triton_utils as tu
from ..define import launches_traced, traceable

_MODES = {"llama": 0, "gemma": 1, "none": 2}
SUM_BLOCK_P, SUM_BLOCK_C = 32, 64  # partial rows per step, columns per program of the partial-sum kernel
# The backward kernels' warps = warps_for(BLOCK) x this factor (at most 32); 1 and 2 compared in
# docs/design/norm-host-overhead.md.
BWD_WARP_FACTOR = 1


def _row_launch(n_cols: int, warp_factor: int = 1) -> tuple[int, int]:
    """(BLOCK, num_warps) of a row kernel over ``n_cols`` columns (one row per block, made once per width). A
    symbolic width (a launch traced with dynamic shapes) is specialised: BLOCK is a compile-time constant."""
    return _row_launch_of(int(n_cols), warp_factor)


@functools.cache
def _row_launch_of(n_cols: int, warp_factor: int) -> tuple[int, int]:
    block = triton.next_power_of_2(n_cols)
    return block, min(32, tu.warps_for(block) * warp_factor)


@triton.jit
def _sum_parts_kernel(PARTS, OUT0, OUT1, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT{s}[c] = sum_p PARTS[s, p, c] cast to OUT's dtype; program (column block, s), s in {0, 1}."""
    s = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n_cols
    base = PARTS + s.to(tl.int64) * n_parts * n_cols
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        m = (rows[:, None] < n_parts) & cmask[None, :]
        acc += tl.sum(tl.load(base + rows[:, None] * n_cols + cols[None, :], mask=m, other=0.0), 0)
    if s == 0:
        tl.store(OUT0 + cols, acc.to(OUT0.dtype.element_ty), mask=cmask)
    else:
        tl.store(OUT1 + cols, acc.to(OUT1.dtype.element_ty), mask=cmask)


def _sum_parts(parts: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each [P, H] fp32 slice of ``parts`` [S, P, H] (S = 1 or 2) summed over P, as a new [H] tensor of ``dtype``."""
    sets, n_parts, h = parts.shape
    outs = [torch.empty(h, dtype=dtype, device=parts.device) for _ in range(sets)]
    # OUT1 of one set is never written; a traced launch must not pass it as OUT0's alias (the functional kernel
    # node would return OUT1's unwritten copy as the result)
    out1 = outs[-1] if sets == 2 or not launches_traced() else torch.empty_like(outs[0])
    traceable(_sum_parts_kernel)[(tu.cdiv(h, SUM_BLOCK_C), sets)](
        parts, outs[0], out1, n_parts, h, BLOCK_P=SUM_BLOCK_P, BLOCK_C=SUM_BLOCK_C, num_warps=4
    )
    return outs


@triton.jit
def _rms_fwd_kernel(
    X, stride_x, W, Y, stride_y, RSTD, n_cols, eps, offset,
    MODE: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_raw = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if MODE == 2:
        x = x_raw
        ms = tl.sum((x * x).to(tl.float32), 0) / n_cols
        rstd = tl.math.rsqrt(ms + eps)
        y = x * rstd.to(x.dtype)
        if HAS_W:
            y = y * (offset + tl.load(W + cols, mask=mask, other=0.0)).to(x.dtype)
    else:
        x = x_raw.to(tl.float32)
        ms = tl.sum(x * x, 0) / n_cols
        rstd = tl.math.rsqrt(ms + eps)
        y = x * rstd
        if MODE == 0:
            # llama: cast the normalised x back to the input dtype, then multiply by (offset + w)
            y = y.to(x_raw.dtype).to(tl.float32)
        if HAS_W:
            y = y * (offset + tl.load(W + cols, mask=mask, other=0.0).to(tl.float32))
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_bwd_kernel(
    DY, stride_dy, DS, stride_ds, X, stride_x, W, RSTD, DX, stride_dx, DW_PART,
    n_rows, n_cols, offset, rows_per_prog,
    MODE: tl.constexpr, HAS_W: tl.constexpr, HAS_DY: tl.constexpr, HAS_DS: tl.constexpr, HAS_DW: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """dx of RMSNorm over X (HAS_DY: through the norm from DY) plus, for the fused add + RMSNorm, the sum's own
    gradient DS (HAS_DS); each program loops over its rows and keeps one fp32 partial row of dw (HAS_DW, which
    needs HAS_W)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    start = pid * rows_per_prog
    end = tl.minimum(start + rows_per_prog, n_rows)
    base = start.to(tl.int64)
    for i in range(0, end - start):
        row = base + i
        if HAS_DY:
            x_raw = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
            dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            xhat = x_raw.to(tl.float32) * rstd
            if HAS_DW:
                if MODE == 0:
                    dw += dy * xhat.to(x_raw.dtype).to(tl.float32)
                else:
                    dw += dy * xhat
            if HAS_W:
                dxhat = dy * w
            else:
                dxhat = dy
            dx = rstd * (dxhat - xhat * (tl.sum(dxhat * xhat, 0) / n_cols))
            if HAS_DS:
                dx += tl.load(DS + row * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            dx = tl.load(DS + row * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)


def _weight_arg(weight: torch.Tensor | None, x2: torch.Tensor) -> torch.Tensor:
    """The kernels' W: the weight, or any tensor when there is none (HAS_W off: never read)."""
    return x2 if weight is None else weight.contiguous()


def norm_out_dtype(x_dtype: torch.dtype, weight: torch.Tensor | None, casting_mode: str) -> torch.dtype:
    """llama multiplies by the weight in the weight's dtype (the result promotes); the others cast back."""
    if casting_mode == "llama" and weight is not None:
        return torch.promote_types(x_dtype, weight.dtype)
    return x_dtype


def _rms_bwd_launch(dy, ds, x2, weight, rstd, dx, offset: float, casting_mode: str, need_dw: bool):
    """Runs :func:`_rms_bwd_kernel` over the rows of ``x2`` [n, h] into ``dx``; ``dy`` / ``ds`` [n, h] or None.
    Returns the [programs, h] fp32 partials of dw (None unless ``need_dw``)."""
    n, h = x2.shape
    progs, per = tu.row_programs(n, x2.device)
    dw_part = torch.empty((progs, h), dtype=torch.float32, device=x2.device) if need_dw else None
    if n:
        block, warps = _row_launch(h, BWD_WARP_FACTOR)
        dy2 = x2 if dy is None else dy
        ds2 = x2 if ds is None else ds
        traceable(_rms_bwd_kernel)[(progs,)](
            dy2, dy2.stride(0), ds2, ds2.stride(0), x2, x2.stride(0), _weight_arg(weight, x2), rstd, dx,
            dx.stride(0), rstd if dw_part is None else dw_part, n, h, float(offset), per, MODE=_MODES[casting_mode],
            HAS_W=weight is not None, HAS_DY=dy is not None, HAS_DS=ds is not None, HAS_DW=need_dw, BLOCK=block,
            num_warps=warps,
        )  # fmt: skip
    return dw_part


def launch_rms_norm_fwd(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, casting_mode: str
):
    shape = x.shape
    x2 = tu.contiguous_rows(x)
    n, h = x2.shape
    y = torch.empty((n, h), dtype=norm_out_dtype(x.dtype, weight, casting_mode), device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        block, warps = _row_launch(h)
        traceable(_rms_fwd_kernel)[(n,)](
            x2,
            x2.stride(0),
            _weight_arg(weight, x2),
            y,
            y.stride(0),
            rstd,
            h,
            float(eps),
            float(offset),
            MODE=_MODES[casting_mode],
            HAS_W=weight is not None,
            BLOCK=block,
            num_warps=warps,
        )
    return y.view(shape), rstd


def launch_rms_norm_bwd(
    dy, x, weight, rstd, offset: float, casting_mode: str, need_dw: bool, in_place: bool = False
):
    shape = x.shape
    x2 = tu.contiguous_rows(x)
    dy2 = tu.contiguous_rows(dy)
    n, h = x2.shape
    if in_place and dy2.dtype == x.dtype and dy2.data_ptr() == dy.data_ptr() and dy.is_contiguous():
        dx = dy2
    else:
        dx = torch.empty((n, h), dtype=x.dtype, device=x.device)
    need_dw = need_dw and weight is not None
    dw_part = _rms_bwd_launch(dy2, None, x2, weight, rstd, dx, offset, casting_mode, need_dw)
    dw = None
    if need_dw:
        dw = _sum_parts(dw_part[None], weight.dtype)[0] if n else torch.zeros_like(weight)
    return dx.view(shape), dw


@triton.jit
def _ln_fwd_kernel(
    X, stride_x, W, B, Y, stride_y, MEAN, RSTD, n_cols, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, 0) / n_cols
    rstd = tl.math.rsqrt(var + eps)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _ln_bwd_kernel(
    DY,
    stride_dy,
    X,
    stride_x,
    W,
    MEAN,
    RSTD,
    DX,
    stride_dx,
    DW_PART,
    DB_PART,
    n_rows,
    n_cols,
    rows_per_prog,
    HAS_W: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    start = pid * rows_per_prog
    end = tl.minimum(start + rows_per_prog, n_rows)
    base = start.to(tl.int64)
    for i in range(0, end - start):
        row = base + i
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        if HAS_W:
            wdy = w * dy
        else:
            wdy = dy
        c1 = tl.sum(xhat * wdy, 0) / n_cols
        c2 = tl.sum(wdy, 0) / n_cols
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DW:
            dw += dy * xhat
        if HAS_DB:
            db += dy
    if HAS_DW:
        tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)
    if HAS_DB:
        tl.store(DB_PART + pid * n_cols + cols, db, mask=mask)


def launch_layer_norm_fwd(x, weight, bias, eps: float):
    """LayerNorm over rows; ``weight`` / ``bias`` None: no scale / no shift."""
    shape = x.shape
    x2 = tu.contiguous_rows(x)
    n, h = x2.shape
    y = torch.empty((n, h), dtype=x.dtype, device=x.device)
    mean = torch.empty(n, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        block, warps = _row_launch(h)
        _ln_fwd_kernel[(n,)](
            x2,
            x2.stride(0),
            _weight_arg(weight, x2),
            bias.contiguous() if bias is not None else x2,
            y,
            y.stride(0),
            mean,
            rstd,
            h,
            float(eps),
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            BLOCK=block,
            num_warps=warps,
        )
    return y.view(shape), mean, rstd


def launch_layer_norm_bwd(dy, x, weight, mean, rstd, need_dw: bool, need_db: bool):
    """dx, and dw / db in the weight's dtype when asked; no dw without a weight."""
    shape = x.shape
    need_dw = need_dw and weight is not None
    grad_dtype = x.dtype if weight is None else weight.dtype
    x2 = tu.contiguous_rows(x)
    dy2 = tu.contiguous_rows(dy)
    n, h = x2.shape
    dx = torch.empty((n, h), dtype=x.dtype, device=x.device)
    progs, per = tu.row_programs(n, x.device)
    sets = int(need_dw) + int(need_db)
    # one buffer for both partials: [dw rows; db rows], summed by one kernel
    parts = torch.empty((sets, progs, h), dtype=torch.float32, device=x.device) if sets else rstd
    if n:
        block, warps = _row_launch(h, BWD_WARP_FACTOR)
        _ln_bwd_kernel[(progs,)](
            dy2,
            dy2.stride(0),
            x2,
            x2.stride(0),
            _weight_arg(weight, x2),
            mean,
            rstd,
            dx,
            dx.stride(0),
            parts,
            parts[sets - 1] if sets else rstd,
            n,
            h,
            per,
            HAS_W=weight is not None,
            HAS_DW=need_dw,
            HAS_DB=need_db,
            BLOCK=block,
            num_warps=warps,
        )
    if not sets:
        return dx.view(shape), None, None
    sums = _sum_parts(parts, grad_dtype) if n else [x.new_zeros(h, dtype=grad_dtype) for _ in range(sets)]
    dw = sums[0] if need_dw else None
    db = sums[-1] if need_db else None
    return dx.view(shape), dw, db


@triton.jit
def _add_rms_fwd_kernel(
    X, stride_x, R, stride_r, W, S, stride_s, Y, stride_y, RSTD, n_cols, eps, offset,
    MODE: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    s_raw = (x + r).to(S.dtype.element_ty)  # the add rounds to the activation dtype, as the eager add does
    tl.store(S + row * stride_s + cols, s_raw, mask=mask)
    s = s_raw.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(s * s, 0) / n_cols + eps)
    y = s * rstd
    if MODE == 0:  # llama: the normalised value is cast to the input dtype before the weight multiplies it
        y = y.to(S.dtype.element_ty).to(tl.float32)
    if HAS_W:
        y = y * (offset + tl.load(W + cols, mask=mask, other=0.0).to(tl.float32))
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


def launch_add_rms_norm_fwd(x, residual, weight, eps: float, offset: float, casting_mode: str):
    """``(s, y, rstd)``: s = residual + x in their promoted dtype, y = rmsnorm(s), rstd per row (fp32)."""
    shape = x.shape
    x2, r2 = tu.contiguous_rows(x), tu.contiguous_rows(residual)
    n, h = x2.shape
    s_dtype = torch.promote_types(x.dtype, residual.dtype)
    s = torch.empty((n, h), dtype=s_dtype, device=x.device)
    y = torch.empty((n, h), dtype=norm_out_dtype(s_dtype, weight, casting_mode), device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        block, warps = _row_launch(h)
        _add_rms_fwd_kernel[(n,)](
            x2, x2.stride(0), r2, r2.stride(0), _weight_arg(weight, x2), s, s.stride(0), y, y.stride(0), rstd,
            h, float(eps), float(offset), MODE=_MODES[casting_mode], HAS_W=weight is not None, BLOCK=block,
            num_warps=warps,
        )  # fmt: skip
    return s.view(shape), y.view(shape), rstd


def launch_add_rms_norm_bwd(dy, ds, s, weight, rstd, offset: float, casting_mode: str, need_dw: bool):
    """``(d_sum, dw)``: the gradient reaching ``s`` (from ds and through the norm from dy), which is the
    gradient of both x and residual, and the weight's (None unless ``need_dw``, a weight and dy are given)."""
    shape = s.shape
    s2 = tu.contiguous_rows(s)
    n, h = s2.shape
    dy2 = tu.contiguous_rows(dy) if dy is not None else None
    ds2 = tu.contiguous_rows(ds) if ds is not None else None
    need_dw = need_dw and dy is not None and weight is not None
    dx = torch.empty((n, h), dtype=s.dtype, device=s.device)
    dw_part = _rms_bwd_launch(dy2, ds2, s2, weight, rstd, dx, offset, casting_mode, need_dw)
    dw = (dw_part.sum(0).to(weight.dtype) if n else torch.zeros_like(weight)) if need_dw else None
    return dx.view(shape), dw
