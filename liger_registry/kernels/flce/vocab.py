"""The FLCE vocabulary strategy: the chunk loop over vocabulary columns, all rows at once.

* :func:`vocab_loop`: chunks laid out by ``plan.vocab_geometry`` (the widest in dW's not yet written memory;
  docs/design/flce-layouts.md), one reused logits buffer [N, Vc]. No host sync inside the loops.
* Pass 1: ``logits_c = X @ W_c^T (+ b_c)`` (cuBLAS, ``out=`` the chunk's logits), the row-statistics kernel
  folds them into each row's running max / sum-exp, target logit, smoothing sum and argmax. Then the per-row loss
  (16-bit logits: with the exact fp32 target logit) and gradient factors.
* Pass 2 (only when a gradient is needed), over the chunks in reverse: recompute ``logits_c`` (not pass 1's last
  chunk's, still there), overwrite it with its gradient in place, ``dX_acc += g @ W_c`` (fp32 accumulation),
  ``dW[c] = g^T @ X`` written once (no read-modify-write: ``accum_dtype`` changes nothing here),
  ``db[c] = g.sum(0)``. With ``N <= H`` every chunk's logits are kept from pass 1 (no logits GEMM in pass 2).
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import torch

from . import plan
from .options import FlceRun
from .plan import vocab_geometry
from .reference import grad_inplace_torch, new_state, row_losses, stats_update_torch
from .target import needs_exact_target, target_logits, target_probs_from_lse
from .triton_kernels import grad_inplace_triton, stats_update_triton

ROW_KERNELS = {
    "torch": (stats_update_torch, grad_inplace_torch),
    "triton": (stats_update_triton, grad_inplace_triton),
}


@cache
def _has_out_dtype(device_type: str) -> bool:
    """Whether ``torch.addmm(..., out_dtype=torch.float32)`` runs here (CUDA, torch >= 2.8)."""
    if device_type != "cuda":
        return False
    a = torch.ones(2, 2, dtype=torch.bfloat16, device=device_type)
    acc = torch.zeros(2, 2, dtype=torch.float32, device=device_type)
    try:
        torch.addmm(acc, a, a, beta=0.0, out_dtype=torch.float32, out=acc)
        torch.addmm(acc, a, a, beta=1.0, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def accumulate_fp32(
    acc: torch.Tensor, g: torch.Tensor, w: torch.Tensor, first: bool, out_dtype_ok: bool
) -> None:
    """``acc (fp32) = [acc +] g @ w``: cuBLAS accumulating straight into fp32 when it can, else upcast operands."""
    beta = 0.0 if first else 1.0
    if acc.dtype == g.dtype == w.dtype:
        torch.addmm(acc, g, w, beta=beta, out=acc)
    elif out_dtype_ok:
        torch.addmm(acc, g, w, beta=beta, out_dtype=torch.float32, out=acc)
    else:
        torch.addmm(acc, g.to(acc.dtype), w.to(acc.dtype), beta=beta, out=acc)


class _Chunk(NamedTuple):
    """One vocabulary chunk, its views made once per call (the loops are host-bound at 2-4k tokens)."""

    start: int
    w: torch.Tensor  # [width, H] rows of the weight
    b: torch.Tensor | None  # [width] of the bias
    buf: (
        torch.Tensor
    )  # [N, width] logits: in dW's storage (scratch, at the chunk's offset) or the budget buffer
    reuse: bool  # pass 2: pass 1 left this chunk's logits in buf


def _views(spans, n: int, w_dt, b_dt, scratch_flat, buffer_flat) -> list[_Chunk]:
    out = []
    for c in spans:
        e = c.start + c.width
        flat = scratch_flat if c.scratch else buffer_flat
        b = None if b_dt is None else b_dt[c.start : e]
        logits = flat[c.offset : c.offset + n * c.width] if c.scratch else flat[: n * c.width]
        out.append(_Chunk(c.start, w_dt[c.start : e], b, logits.view(n, c.width), c.reuse))
    return out


def _logits(hidden, c: _Chunk) -> torch.Tensor:
    """``hidden @ w_c^T (+ b_c)`` into the chunk's buffer view."""
    if c.b is not None:
        torch.addmm(c.b, hidden, c.w.t(), out=c.buf)
    else:
        torch.mm(hidden, c.w.t(), out=c.buf)
    return c.buf


def _keep(hidden: torch.Tensor, v: int, chunk: int, multiple: int) -> bool:
    """The planner's layout choice (:func:`plan.keeps_every_chunk`) on this call's device."""
    peaks = plan.peaks_of(hidden.device)
    return plan.keeps_every_chunk(*hidden.shape, v, chunk, hidden.dtype.itemsize, peaks, multiple)


def vocab_loop(hidden, weight, target, bias, class_weights, row_grad, run: FlceRun, need, ce_scale, z_scale):
    """Same contract as :func:`tokens.token_loop`, chunked over vocabulary columns as
    :func:`plan.vocab_geometry` lays them out for a budget buffer of ``run.chunk`` columns."""
    opts = run.options
    n, h = hidden.shape
    v = weight.shape[0]
    stats_update, grad_inplace = ROW_KERNELS[run.backend]
    w_dt = weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)
    b_dt = None if bias is None else bias.to(hidden.dtype)
    target = target.contiguous()
    cw = None if class_weights is None else class_weights.contiguous()
    kw = {"opts": opts, "class_weights": cw}
    # dW rows are written once, in pass 2: until then their memory holds logits (see vocab_geometry)
    dw = torch.empty((v, h), dtype=hidden.dtype, device=hidden.device) if need[1] else None
    multiple = min(plan.COL_MULTIPLE, plan.VOCAB_ALIGN)
    geometry = vocab_geometry(
        n, h, v, run.chunk, dw is not None, multiple, _keep(hidden, v, run.chunk, multiple)
    )
    buffer_flat = torch.empty(n * geometry.buffer_cols, dtype=hidden.dtype, device=hidden.device)
    scratch_flat = None if dw is None else dw.view(-1)
    state = new_state(n, hidden.device)
    argmax = bool(run.argmax_mode)
    _pass1(
        stats_update,
        hidden,
        _views(geometry.pass1, n, w_dt, b_dt, scratch_flat, buffer_flat),
        target,
        state,
        argmax,
        kw,
    )
    zy = (
        target_logits(hidden, weight, target, bias, opts, run.backend) if needs_exact_target(hidden) else None
    )
    ce, zl, coefs = row_losses(
        state, target, v, ce_scale=ce_scale, z_scale=z_scale, row_grad=row_grad, zy_exact=zy, **kw
    )
    if opts.use_token_scaling:
        p = target_probs_from_lse(coefs.lse, state.zy if zy is None else zy, target, opts.ignore_index)
        ce, zl = ce * p, zl * p
        coefs = coefs._replace(coef=coefs.coef * p, a_s=coefs.a_s * p, sm=coefs.sm * p)
    pass2 = _views(geometry.pass2, n, w_dt, b_dt, scratch_flat, buffer_flat)
    acc, db = _grads(hidden, target, pass2, dw, coefs, grad_inplace, kw, need)
    # no view of the logits buffer outlives pass 2, so dX's cast out of its fp32 accumulator may reuse its memory
    del pass2, buffer_flat
    dh = _dh(acc, hidden) if need[0] else None
    best_i = state.best_i if run.argmax_mode else None
    has_z = opts.lse_square_scale != 0.0
    if opts.reduction == "none":
        return ce, (zl if has_z else None), best_i, dh, dw, db
    return ce.sum(), (zl.sum() if has_z else None), best_i, dh, dw, db


def _pass1(stats_update, hidden, chunks, target, state, argmax, kw) -> None:
    """Pass 1: each chunk's logits folded into the rows' running statistics (``state``)."""
    for c in chunks:
        stats_update(_logits(hidden, c), c.start, target, state, argmax=argmax, **kw)


def _grads(hidden, target, chunks, dw, coefs, grad_inplace, kw, need):
    """Pass 2 (``chunks`` in descending column order): the in-place gradient of each chunk, ``dX += g @ W_c``
    in fp32, ``dW[c] = g^T @ X`` and ``db[c] = sum(g)`` written once. Returns ``(dX's fp32 accumulator, db)``;
    ``dw`` is filled."""
    need_dh, need_dw, need_db = need
    if not (need_dh or need_dw or need_db):
        return None, None
    n, h = hidden.shape
    device = hidden.device
    v = sum(c.w.shape[0] for c in chunks)
    acc = torch.empty((n, h), dtype=torch.float32, device=device) if need_dh and n else None
    out_dtype_ok = _has_out_dtype(device.type)
    db = torch.empty(v, dtype=torch.float32, device=device) if need_db else None
    for i, c in enumerate(chunks):
        buf = c.buf if c.reuse else _logits(hidden, c)
        grad_inplace(buf, c.start, target, coefs, **kw)
        if acc is not None:
            accumulate_fp32(acc, buf, c.w, i == 0, out_dtype_ok)
        if dw is not None:
            torch.mm(buf.t(), hidden, out=dw[c.start : c.start + c.w.shape[0]])
        if db is not None:
            torch.sum(buf, 0, dtype=torch.float32, out=db[c.start : c.start + c.w.shape[0]])
    return acc, db


def _dh(acc: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """dX in the hidden states' dtype from its fp32 accumulator (``None``: no rows)."""
    if acc is None:
        return torch.empty((0, hidden.shape[1]), dtype=hidden.dtype, device=hidden.device)
    return acc.to(hidden.dtype)
