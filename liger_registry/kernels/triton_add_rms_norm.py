"""Triton fused residual add + RMSNorm: ``s = residual + x`` and ``rmsnorm(s)`` in one row pass; the backward
gives the gradient of both outputs (``ds + d rmsnorm``, shared by x and residual) and the weight's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_utils as tu

MODES = {"llama": 0, "gemma": 1}


@triton.jit
def _add_rms_fwd_kernel(
    X, stride_x, R, stride_r, W, S, stride_s, Y, stride_y, RSTD, n_cols, eps, offset,
    MODE: tl.constexpr, BLOCK: tl.constexpr,
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
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    sn = s * rstd
    if MODE == 0:  # llama: the normalised value is cast to the input dtype before the weight multiplies it
        sn = sn.to(S.dtype.element_ty).to(tl.float32)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, (sn * (offset + w)).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_bwd_kernel(
    DY, stride_dy, DS, stride_ds, S, stride_s, W, RSTD, DX, stride_dx, DW_PART,
    n_rows, n_cols, offset, rows_per_prog,
    MODE: tl.constexpr, HAS_DY: tl.constexpr, HAS_DS: tl.constexpr, HAS_DW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
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
        dx = tl.zeros([BLOCK], dtype=tl.float32)
        if HAS_DY:
            s_raw = tl.load(S + row * stride_s + cols, mask=mask, other=0.0)
            dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            shat = s_raw.to(tl.float32) * rstd
            if HAS_DW:
                if MODE == 0:
                    dw += dy * shat.to(s_raw.dtype).to(tl.float32)
                else:
                    dw += dy * shat
            dshat = dy * w
            dx += rstd * (dshat - shat * (tl.sum(dshat * shat, 0) / n_cols))
        if HAS_DS:
            dx += tl.load(DS + row * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_DW:
        tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)


def add_rms_norm_fwd(x, residual, weight, eps: float, offset: float, casting_mode: str):
    """``(s, y, rstd)``: s = residual + x in their promoted dtype, y = rmsnorm(s), rstd per row (fp32)."""
    shape = x.shape
    x2, r2 = tu.contiguous_rows(x), tu.contiguous_rows(residual)
    n, h = x2.shape
    s_dtype = torch.promote_types(x.dtype, residual.dtype)
    y_dtype = torch.promote_types(s_dtype, weight.dtype) if casting_mode == "llama" else s_dtype
    s = torch.empty((n, h), dtype=s_dtype, device=x.device)
    y = torch.empty((n, h), dtype=y_dtype, device=x.device)
    rstd = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        block = triton.next_power_of_2(h)
        _add_rms_fwd_kernel[(n,)](
            x2, x2.stride(0), r2, r2.stride(0), weight.contiguous(), s, s.stride(0), y, y.stride(0), rstd,
            h, float(eps), float(offset), MODE=MODES[casting_mode], BLOCK=block, num_warps=tu.warps_for(block),
        )  # fmt: skip
    return s.view(shape), y.view(shape), rstd


def add_rms_norm_bwd(dy, ds, s, weight, rstd, offset: float, casting_mode: str, need_dw: bool):
    """``(d_sum, dw)``: the gradient reaching ``s`` (from ds and through the norm from dy), which is the
    gradient of both x and residual, and the weight's (None unless ``need_dw`` and dy is given)."""
    shape = s.shape
    s2 = tu.contiguous_rows(s)
    n, h = s2.shape
    dy2 = tu.contiguous_rows(dy) if dy is not None else s2
    ds2 = tu.contiguous_rows(ds) if ds is not None else s2
    need_dw = need_dw and dy is not None
    dx = torch.empty((n, h), dtype=s.dtype, device=s.device)
    progs, per = tu.row_programs(n, s.device)
    dw_part = torch.empty((progs, h), dtype=torch.float32, device=s.device) if need_dw else rstd
    if n:
        block = triton.next_power_of_2(h)
        _add_rms_bwd_kernel[(progs,)](
            dy2, dy2.stride(0), ds2, ds2.stride(0), s2, s2.stride(0), weight.contiguous(), rstd, dx, dx.stride(0),
            dw_part, n, h, float(offset), per, MODE=MODES[casting_mode], HAS_DY=dy is not None,
            HAS_DS=ds is not None, HAS_DW=need_dw, BLOCK=block, num_warps=tu.warps_for(block),
        )  # fmt: skip
    dw = (dw_part.sum(0).to(weight.dtype) if n else torch.zeros_like(weight)) if need_dw else None
    return dx.view(shape), dw
