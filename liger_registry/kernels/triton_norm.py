"""Triton RMSNorm (llama / gemma / none casting, offset) and LayerNorm: forward and backward row kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_utils as tu

_MODES = {"llama": 0, "gemma": 1, "none": 2}


@triton.jit
def _rms_fwd_kernel(
    X, stride_x, W, Y, stride_y, RSTD, n_cols, eps, offset, MODE: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_raw = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    if MODE == 2:
        x = x_raw
        ms = tl.sum((x * x).to(tl.float32), 0) / n_cols
        rstd = tl.math.rsqrt(ms + eps)
        y = x * rstd.to(x.dtype) * (offset + w).to(x.dtype)
    else:
        x = x_raw.to(tl.float32)
        ms = tl.sum(x * x, 0) / n_cols
        rstd = tl.math.rsqrt(ms + eps)
        xn = x * rstd
        if MODE == 0:
            # llama: cast the normalised x back to the input dtype, then multiply by (offset + w)
            xn = xn.to(x_raw.dtype).to(tl.float32)
            y = xn * (offset + w.to(tl.float32))
        else:
            y = xn * (offset + w.to(tl.float32))
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_bwd_kernel(
    DY,
    stride_dy,
    X,
    stride_x,
    W,
    RSTD,
    DX,
    stride_dx,
    DW_PART,
    n_rows,
    n_cols,
    offset,
    rows_per_prog,
    MODE: tl.constexpr,
    HAS_DW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    start = pid * rows_per_prog
    end = tl.minimum(start + rows_per_prog, n_rows)
    base = start.to(tl.int64)
    for i in range(0, end - start):
        row = base + i
        x_raw = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
        x = x_raw.to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        if HAS_DW:
            if MODE == 0:
                dw += dy * xhat.to(x_raw.dtype).to(tl.float32)
            else:
                dw += dy * xhat
        dxhat = dy * w
        c = tl.sum(dxhat * xhat, 0) / n_cols
        dx = rstd * (dxhat - xhat * c)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)


def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, casting_mode: str):
    shape = x.shape
    x2 = tu.contiguous_rows(x)
    n, h = x2.shape
    out_dtype = torch.promote_types(x.dtype, weight.dtype) if casting_mode == "llama" else x.dtype
    y = torch.empty((n, h), dtype=out_dtype, device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        block = triton.next_power_of_2(h)
        _rms_fwd_kernel[(n,)](
            x2,
            x2.stride(0),
            weight.contiguous(),
            y,
            y.stride(0),
            rstd,
            h,
            float(eps),
            float(offset),
            MODE=_MODES[casting_mode],
            BLOCK=block,
            num_warps=tu.warps_for(block),
        )
    return y.view(shape), rstd


def rms_norm_bwd(
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
    progs, per = tu.row_programs(n, x.device)
    dw_part = torch.empty((progs, h), dtype=torch.float32, device=x.device) if need_dw else rstd
    if n:
        block = triton.next_power_of_2(h)
        _rms_bwd_kernel[(progs,)](
            dy2,
            dy2.stride(0),
            x2,
            x2.stride(0),
            weight.contiguous(),
            rstd,
            dx,
            dx.stride(0),
            dw_part,
            n,
            h,
            float(offset),
            per,
            MODE=_MODES[casting_mode],
            HAS_DW=need_dw,
            BLOCK=block,
            num_warps=tu.warps_for(block),
        )
    dw = None
    if need_dw:
        dw = dw_part.sum(0).to(weight.dtype) if n else torch.zeros_like(weight)
    return dx.view(shape), dw


@triton.jit
def _ln_fwd_kernel(
    X, stride_x, W, B, Y, stride_y, MEAN, RSTD, n_cols, eps, HAS_B: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, 0) / n_cols
    rstd = tl.math.rsqrt(var + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w
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
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
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
        wdy = w * dy
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


def layer_norm_fwd(x, weight, bias, eps: float):
    shape = x.shape
    x2 = tu.contiguous_rows(x)
    n, h = x2.shape
    y = torch.empty((n, h), dtype=x.dtype, device=x.device)
    mean = torch.empty(n, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        block = triton.next_power_of_2(h)
        _ln_fwd_kernel[(n,)](
            x2,
            x2.stride(0),
            weight.contiguous(),
            bias.contiguous() if bias is not None else weight,
            y,
            y.stride(0),
            mean,
            rstd,
            h,
            float(eps),
            HAS_B=bias is not None,
            BLOCK=block,
            num_warps=tu.warps_for(block),
        )
    return y.view(shape), mean, rstd


def layer_norm_bwd(dy, x, weight, mean, rstd, need_dw: bool, need_db: bool):
    shape = x.shape
    x2 = tu.contiguous_rows(x)
    dy2 = tu.contiguous_rows(dy)
    n, h = x2.shape
    dx = torch.empty((n, h), dtype=x.dtype, device=x.device)
    progs, per = tu.row_programs(n, x.device)
    dw_part = torch.empty((progs, h), dtype=torch.float32, device=x.device) if need_dw else rstd
    db_part = torch.empty((progs, h), dtype=torch.float32, device=x.device) if need_db else rstd
    if n:
        block = triton.next_power_of_2(h)
        _ln_bwd_kernel[(progs,)](
            dy2,
            dy2.stride(0),
            x2,
            x2.stride(0),
            weight.contiguous(),
            mean,
            rstd,
            dx,
            dx.stride(0),
            dw_part,
            db_part,
            n,
            h,
            per,
            HAS_DW=need_dw,
            HAS_DB=need_db,
            BLOCK=block,
            num_warps=tu.warps_for(block),
        )
    dw = (dw_part.sum(0).to(weight.dtype) if n else torch.zeros_like(weight)) if need_dw else None
    db = (
        (db_part.sum(0).to(weight.dtype) if n else torch.zeros(h, dtype=weight.dtype, device=x.device))
        if need_db
        else None
    )
    return dx.view(shape), dw, db
