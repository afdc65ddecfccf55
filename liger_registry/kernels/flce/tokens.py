"""The FLCE token strategy: the chunk loop over rows.

* :func:`token_loop`: per chunk of ``run.chunk`` rows one logits GEMM, the row kernel (loss and in-place
  gradient), the dX GEMM into the output and the dW addmm into one accumulator.
"""

from __future__ import annotations

import torch

from ..ce.triton_kernels import ce_rows_for, row_scales
from .options import FlceRun
from .target import chunk_target_probs, needs_exact_target, target_logits, with_row_factor


def _addmm_dw(dw: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> None:
    """dw += g.T @ h, written straight into the accumulator (fp32 accumulation without upcast copies)."""
    if dw.dtype == g.dtype == h.dtype:
        dw.addmm_(g.t(), h)
        return
    if (
        dw.is_cuda
        and dw.dtype == torch.float32
        and g.dtype == h.dtype
        and g.dtype in (torch.float16, torch.bfloat16)
    ):
        try:
            torch.addmm(dw, g.t(), h, out_dtype=torch.float32, out=dw)
            return
        except (TypeError, RuntimeError):
            pass
    dw.addmm_(g.t().to(dw.dtype), h.to(dw.dtype))


def token_loop(hidden, weight, target, bias, class_weights, row_grad, run: FlceRun, need, ce_scale, z_scale):
    """One pass over token chunks of ``run.chunk`` rows. Returns ``(ce, z, argmax, dh, dw, db)`` where ``ce``/``z``
    are per-row fp32 (reduction ``none``) or unscaled fp32 sums (``z`` None without z-loss), ``argmax`` [N] or None.

    16-bit logits: the loss takes each row's exact fp32 target logit (``target``). One logits buffer is
    reused for every chunk; the row kernel overwrites it with the logits gradient (scaling
    fused in), dX chunks are written straight into the output and dW is accumulated by ``addmm``.
    """
    opts = run.options
    need_dh, need_dw, need_db = need
    n, h = hidden.shape
    device = hidden.device
    chunk = max(min(run.chunk, n), 1)
    nchunks = -(-n // chunk)
    w_dt = weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)
    has_z = opts.lse_square_scale != 0.0
    per_token = opts.reduction == "none"
    rows = n if per_token else chunk
    ce_rows = torch.empty(rows, dtype=torch.float32, device=device)
    z_rows = torch.empty(rows, dtype=torch.float32, device=device) if has_z else None
    if not per_token:  # reduced per chunk into [num_chunks] partial sums (deterministic)
        ce_part = torch.zeros(max(nchunks, 1), dtype=torch.float32, device=device)
        z_part = torch.zeros(max(nchunks, 1), dtype=torch.float32, device=device) if has_z else None
    argmax = torch.zeros(n, dtype=torch.long, device=device) if run.argmax_mode else None
    compute_grad = need_dh or need_dw or need_db
    dh = torch.empty((n, h), dtype=hidden.dtype, device=device) if need_dh else None
    acc_dtype = opts.accum_dtype if opts.accum_dtype is not None else weight.dtype
    # dW: the first chunk writes it with a plain GEMM (no memset, no read); later chunks addmm into it
    dw_direct = need_dw and acc_dtype == hidden.dtype and n > 0
    dw = None
    if need_dw:
        dw = (torch.empty if dw_direct else torch.zeros)(weight.shape, dtype=acc_dtype, device=device)
    db = torch.zeros(weight.shape[0], dtype=torch.float32, device=device) if need_db else None
    kernel = ce_rows_for(run.backend)
    extra = row_scales(run.backend, ce_scale, z_scale, class_weights, device)
    b_dt = None if bias is None else bias.to(hidden.dtype)
    zy = (
        target_logits(hidden, weight, target, bias, opts, run.backend) if needs_exact_target(hidden) else None
    )
    buf_full = torch.empty((chunk, weight.shape[0]), dtype=hidden.dtype, device=device) if n else None
    for i in range(nchunks):
        s, e = i * chunk, min((i + 1) * chunk, n)
        h_c = hidden[s:e]
        buf = buf_full[: e - s]
        if b_dt is not None:
            torch.addmm(b_dt, h_c, w_dt.t(), out=buf)
        else:
            torch.mm(h_c, w_dt.t(), out=buf)
        r = slice(s, e) if per_token else slice(0, e - s)
        zy_c = None if zy is None else zy[s:e]
        rg = None if row_grad is None else row_grad[s:e]
        scale = chunk_target_probs(buf, target[s:e], opts, zy_c) if opts.use_token_scaling else None
        kernel(
            buf,
            target[s:e],
            ignore_index=opts.ignore_index,
            label_smoothing=opts.label_smoothing,
            softcap=opts.softcap,
            logit_scale=opts.logit_scale,
            lse_square_scale=opts.lse_square_scale,
            class_weights=class_weights,
            ce_grad_scale=ce_scale,
            z_grad_scale=z_scale,
            row_grad=rg if scale is None else with_row_factor(rg, scale),
            compute_grad=compute_grad,
            argmax_mode=run.argmax_mode,
            out=(ce_rows[r], z_rows[r] if has_z else None, argmax[s:e] if run.argmax_mode else None),
            target_logit=zy_c,
            **extra,
        )
        if scale is not None:
            ce_rows[r] *= scale
            if has_z:
                z_rows[r] *= scale
        if not per_token:
            torch.sum(ce_rows[r], 0, keepdim=True, out=ce_part[i : i + 1])
            if has_z:
                torch.sum(z_rows[r], 0, keepdim=True, out=z_part[i : i + 1])
        if need_dh:
            torch.mm(buf, w_dt, out=dh[s:e])
        if need_dw:
            if dw_direct and i == 0:
                torch.mm(buf.t(), h_c, out=dw)
            else:
                _addmm_dw(dw, buf, h_c)
        if need_db:
            db += buf.sum(0, dtype=torch.float32)
    if per_token:
        return ce_rows, z_rows, argmax, dh, dw, db
    return ce_part.sum(), (z_part.sum() if has_z else None), argmax, dh, dw, db
