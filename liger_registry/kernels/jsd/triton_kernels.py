"""Triton generalised-JSD rows kernel of fused linear JSD and its launcher.

* ``jsd_rows_triton``: loss per row, the student-logit gradient written in place.
* Same contract as ``reference.jsd_rows_torch``; one program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import triton_utils as tu


@triton.jit
def _jsd_terms(x, y, beta, MODE: tl.constexpr):
    """Per-column loss and d(loss)/d(student log-prob), from log-probs x (student) and y (teacher)."""
    q = tl.exp(x)
    if MODE == 0:
        p = tl.exp(y)
        lrow = p * (y - x)
        dx = -p
    elif MODE == 1:
        lrow = q * (x - y)
        dx = lrow + q
    else:
        p = tl.exp(y)
        log_m = tl.log(beta * p + (1.0 - beta) * q)
        lrow = beta * p * (y - log_m) + (1.0 - beta) * q * (x - log_m)
        dx = (1.0 - beta) * q * (x - log_m)
    return lrow, dx, q


@triton.jit
def _jsd_rows_kernel(
    S,
    stride_s,
    T,
    stride_t,
    VALID,
    LOSS,
    SCALE,
    n_cols,
    beta,
    inv_temp,
    MODE: tl.constexpr,  # 0 forward KL (beta=0), 1 reverse KL (beta=1), 2 mixture
    COMPUTE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    s_ptr = S + row * stride_s
    t_ptr = T + row * stride_t
    offs = tl.arange(0, BLOCK)
    valid = tl.load(VALID + row) != 0
    if not valid:
        tl.store(LOSS + row, 0.0)
        if COMPUTE_GRAD:
            for start in range(0, n_cols, BLOCK):
                cols = start + offs
                tl.store(s_ptr + cols, tl.zeros([BLOCK], dtype=S.dtype.element_ty), mask=cols < n_cols)
        return
    ms = float("-inf")
    ds = 0.0
    mt = float("-inf")
    dt = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        zs = tl.load(s_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_temp
        zt = tl.load(t_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32) * inv_temp
        mn = tl.maximum(ms, tl.max(zs, 0))
        ds = ds * tl.exp(ms - mn) + tl.sum(tl.exp(zs - mn), 0)
        ms = mn
        mn = tl.maximum(mt, tl.max(zt, 0))
        dt = dt * tl.exp(mt - mn) + tl.sum(tl.exp(zt - mn), 0)
        mt = mn
    lse_s = ms + tl.log(ds)
    lse_t = mt + tl.log(dt)
    loss = 0.0
    sdx = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(s_ptr + cols, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_s
        y = tl.load(t_ptr + cols, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_t
        lrow, dx, q = _jsd_terms(x, y, beta, MODE)
        loss += tl.sum(tl.where(mask, lrow, 0.0), 0)
        sdx += tl.sum(tl.where(mask, dx, 0.0), 0)
    tl.store(LOSS + row, loss)
    if COMPUTE_GRAD:
        g_s = tl.load(SCALE) * inv_temp
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            mask = cols < n_cols
            x = tl.load(s_ptr + cols, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_s
            y = tl.load(t_ptr + cols, mask=mask, other=0.0).to(tl.float32) * inv_temp - lse_t
            _, dx, q = _jsd_terms(x, y, beta, MODE)
            g = (dx - q * sdx) * g_s
            tl.store(s_ptr + cols, g.to(S.dtype.element_ty), mask=mask)


@torch.no_grad()
def jsd_rows_triton(s_buf, t_buf, valid, *, beta: float, temperature: float, grad_scale, compute_grad: bool):
    """Same contract as :func:`jsd.jsd_rows_torch`."""
    n, v = s_buf.shape
    loss = torch.empty(n, dtype=torch.float32, device=s_buf.device)
    if n == 0:
        return loss
    if s_buf.stride(1) != 1 or t_buf.stride(1) != 1:
        raise ValueError("jsd_rows_triton: logits need unit column stride")
    scale = grad_scale if isinstance(grad_scale, torch.Tensor) else torch.tensor(float(grad_scale))
    scale = scale.to(device=s_buf.device, dtype=torch.float32).reshape(1)
    mode = 0 if beta == 0.0 else (1 if beta == 1.0 else 2)
    block = tu.row_block(v)
    _jsd_rows_kernel[(n,)](
        s_buf,
        s_buf.stride(0),
        t_buf,
        t_buf.stride(0),
        valid.to(torch.int8).contiguous(),
        loss,
        scale,
        v,
        float(beta),
        1.0 / float(temperature),
        MODE=mode,
        COMPUTE_GRAD=bool(compute_grad),
        BLOCK=block,
        num_warps=tu.warps_for(block),
    )
    return loss
