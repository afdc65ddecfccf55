"""Fused linear cross entropy: loss of ``softcap((hidden @ W.T + b) * scale)`` chunked over tokens."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import ce_torch
from .op import requested_backend


class FLCEOutput(NamedTuple):
    """Returned when any ``return_*`` flag is set; fields not asked for are ``None``."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None
    token_accuracy: torch.Tensor | None
    predicted_tokens: torch.Tensor | None


def check_chunk_mem_const(chunk_mem_const: object, name: str = "chunk_mem_const") -> int:
    if isinstance(chunk_mem_const, bool) or not isinstance(chunk_mem_const, int) or chunk_mem_const < 1:
        raise ValueError(f"{name} must be a positive int, got {chunk_mem_const!r}")
    return chunk_mem_const


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def flce_chunk_geometry(bt: int, h: int, v: int, chunk_mem_const: int = 1) -> tuple[int, int]:
    """``(chunk_size, num_chunks)`` for ``bt`` tokens: ``inc = ceil(V / (C*H))``,
    ``chunk = min(next_pow2(ceil(BT / inc)), BT)``, ``num_chunks = ceil(BT / chunk)``.

    At BT=8192, H=4096, V=128256: C=1 -> (256, 32), C=8 -> (2048, 4), C=16 -> (4096, 2).
    """
    c = check_chunk_mem_const(chunk_mem_const)
    for name, val in (("bt", bt), ("h", h), ("v", v)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise ValueError(f"{name} must be a non-negative int, got {val!r}")
    if bt == 0:
        return 0, 0
    inc = max(1, math.ceil(v / (c * max(h, 1))))
    chunk = min(_next_pow2(math.ceil(bt / inc)), bt)
    return chunk, math.ceil(bt / chunk)


def _ce_rows(backend: str):
    if backend == "triton":
        from .triton_ce import ce_rows_triton

        return ce_rows_triton
    return ce_torch.ce_rows_torch


def flce_compute(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    ignore_index: int,
    label_smoothing: float,
    softcap: float | None,
    logit_scale: float,
    lse_square_scale: float,
    reduction: str,
    class_weights: torch.Tensor | None,
    accum_dtype: torch.dtype | None,
    chunk_mem_const: int,
    need_dh: bool,
    need_dw: bool,
    need_db: bool,
    row_grad: torch.Tensor | None = None,
    backend: str = "torch",
):
    """One pass over the chunks. Returns ``(loss, z_loss, n_correct_rows, argmax, dh, dw, db)``.

    ``loss``/``z_loss`` are reduced (or per token for ``none``); gradients are those of ``loss``
    (times ``row_grad`` per token when given), ``None`` where not needed. One logits buffer is reused.
    """
    n, h = hidden.shape
    v = weight.shape[0]
    device = hidden.device
    w_dt = weight.to(hidden.dtype)  # the GEMMs run in hidden's dtype (autocast-style); dW keeps weight's dtype
    valid, n_valid, denom = ce_torch.denominators(target, ignore_index, class_weights)
    if reduction == "mean":
        one = torch.ones((), dtype=torch.float32, device=device)
        ce_scale = one / denom.clamp(min=1e-30) if class_weights is not None else one / n_valid.clamp(min=1.0)
        z_scale = one / n_valid.clamp(min=1.0)
        ce_scale = torch.where(denom > 0, ce_scale, torch.zeros_like(ce_scale))
    else:
        ce_scale = 1.0
        z_scale = 1.0
    chunk, nchunks = flce_chunk_geometry(n, h, v, chunk_mem_const)
    ce_all = torch.zeros(n, dtype=torch.float32, device=device)
    z_all = torch.zeros(n, dtype=torch.float32, device=device)
    argmax_all = torch.zeros(n, dtype=torch.long, device=device)
    compute_grad = need_dh or need_dw or need_db
    dh = torch.empty(hidden.shape, dtype=hidden.dtype, device=device) if need_dh else None
    acc_dtype = accum_dtype if accum_dtype is not None else weight.dtype
    dw = torch.zeros(weight.shape, dtype=acc_dtype, device=device) if need_dw else None
    db = torch.zeros(v, dtype=torch.float32, device=device) if need_db else None
    ce_rows = _ce_rows(backend)
    buf = None
    for i in range(nchunks):
        s, e = i * chunk, min((i + 1) * chunk, n)
        h_c = hidden[s:e]
        if buf is None or buf.shape[0] != e - s:
            buf = torch.empty((e - s, v), dtype=hidden.dtype, device=device) if buf is None else buf[: e - s]
        if bias is not None:
            torch.addmm(bias.to(hidden.dtype), h_c, w_dt.t(), out=buf)
        else:
            torch.mm(h_c, w_dt.t(), out=buf)
        ce_c, z_c, am_c = ce_rows(
            buf,
            target[s:e],
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            softcap=softcap,
            logit_scale=logit_scale,
            lse_square_scale=lse_square_scale,
            class_weights=class_weights,
            ce_grad_scale=ce_scale,
            z_grad_scale=z_scale,
            row_grad=None if row_grad is None else row_grad[s:e],
            compute_grad=compute_grad,
        )
        ce_all[s:e] = ce_c
        z_all[s:e] = z_c
        argmax_all[s:e] = am_c
        if not compute_grad:
            continue
        if need_dh:
            torch.mm(buf, w_dt, out=dh[s:e])
        if need_dw:
            if dw.dtype == buf.dtype:
                dw.addmm_(buf.t(), h_c)
            else:
                dw.addmm_(buf.t().to(dw.dtype), h_c.to(dw.dtype))
        if need_db:
            db += buf.sum(0, dtype=torch.float32)
    if reduction == "none":
        loss, z_loss = ce_all + z_all, z_all
    elif reduction == "sum":
        loss, z_loss = ce_all.sum() + z_all.sum(), z_all.sum()
    else:
        z_loss = z_all.sum() * z_scale
        loss = ce_all.sum() * ce_scale + z_loss
    n_correct = ((argmax_all == target) & valid).sum()
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    if db is not None and bias is not None:
        db = db.to(bias.dtype)
    return loss, z_loss, n_correct, argmax_all, dh, dw, db


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd Function of FLCE. Stable positional signature; new arguments go last, with defaults:

    ``(hidden, weight, target, bias, ignore_index, label_smoothing, softcap, logit_scale, lse_square_scale,
    reduction, class_weights, accum_dtype, chunk_mem_const, backend)`` -> ``(loss, z_loss, n_correct, argmax)``.

    For ``mean``/``sum`` the forward computes the gradients chunk by chunk and the backward only scales them by
    ``grad_output``; for ``none`` the forward keeps the inputs and the backward recomputes per chunk with the
    per-token ``grad_output`` (the only exact way without storing [N, V]).
    """

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        target,
        bias=None,
        ignore_index=-100,
        label_smoothing=0.0,
        softcap=None,
        logit_scale=1.0,
        lse_square_scale=0.0,
        reduction="mean",
        class_weights=None,
        accum_dtype=None,
        chunk_mem_const=1,
        backend="torch",
    ):
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_db = bias is not None and ctx.needs_input_grad[3]
        opts = dict(
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            softcap=softcap,
            logit_scale=logit_scale,
            lse_square_scale=lse_square_scale,
            reduction=reduction,
            class_weights=class_weights,
            accum_dtype=accum_dtype,
            chunk_mem_const=chunk_mem_const,
            backend=backend,
        )
        eager = reduction != "none"
        loss, z_loss, n_correct, argmax, dh, dw, db = flce_compute(
            hidden,
            weight,
            target,
            bias,
            need_dh=need_dh and eager,
            need_dw=need_dw and eager,
            need_db=need_db and eager,
            **opts,
        )
        ctx.reduction = reduction
        ctx.flags = (need_dh, need_dw, need_db)
        if eager:
            ctx.save_for_backward(dh, dw, db)
        else:
            ctx.opts = opts
            ctx.save_for_backward(hidden, weight, target, bias, class_weights)
        ctx.mark_non_differentiable(z_loss, n_correct, argmax)
        return loss, z_loss, n_correct, argmax

    @staticmethod
    def backward(ctx, grad_loss, *_):
        need_dh, need_dw, need_db = ctx.flags
        if ctx.reduction != "none":
            dh, dw, db = ctx.saved_tensors
            go = grad_loss
            if go is not None and not bool(torch.equal(go, torch.ones_like(go))):
                dh = dh * go.to(dh.dtype) if dh is not None else None
                dw = dw * go.to(dw.dtype) if dw is not None else None
                db = db * go.to(db.dtype) if db is not None else None
        else:
            hidden, weight, target, bias, class_weights = ctx.saved_tensors
            opts = dict(ctx.opts)
            opts["class_weights"] = class_weights
            _, _, _, _, dh, dw, db = flce_compute(
                hidden,
                weight,
                target,
                bias,
                need_dh=need_dh,
                need_dw=need_dw,
                need_db=need_db,
                row_grad=grad_loss,
                **opts,
            )
        return (dh, dw, None, db) + (None,) * 10


def _flce_backend(hidden: torch.Tensor, weight: torch.Tensor) -> str:
    from .op import OPS

    return OPS["fused_linear_cross_entropy"].choose(hidden, weight)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    lse_square_scale: float = 0.0,
    return_z_loss: bool = False,
    reduction: str = "mean",
    class_weights: torch.Tensor | None = None,
    accum_dtype: torch.dtype | None = None,
    chunk_mem_const: int = 1,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
):
    """Cross entropy of ``softcap((hidden @ weight.T + bias) * logit_scale)`` without materialising [N, V].

    hidden [N, H], weight [V, H], target [N] (long), bias [V] or None. Loss in fp32, semantics of
    ``F.cross_entropy`` (label smoothing, class weights) plus z-loss (``lse_square_scale * lse**2`` per
    non-ignored token, added to the loss; ``mean`` divides it by the number of non-ignored tokens).
    All targets ignored -> loss 0 with zero gradients. Chunked by :func:`flce_chunk_geometry`.
    Gradients come back in hidden's / weight's dtype; ``accum_dtype=torch.float32`` accumulates dW in fp32.
    Returns the loss, or :class:`FLCEOutput` when any ``return_*`` flag is set (``token_accuracy`` is the
    fraction of non-ignored tokens whose argmax is the target; ``predicted_tokens`` the argmax of every row).
    """
    ce_torch.check_ce_options(label_smoothing, softcap, reduction)
    check_chunk_mem_const(chunk_mem_const)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if target.shape != (hidden.shape[0],):
        raise ValueError(f"target must be [N]={hidden.shape[0]}; got {tuple(target.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [V]={weight.shape[0]}; got {tuple(bias.shape)}")
    if class_weights is not None and class_weights.shape != (weight.shape[0],):
        raise ValueError(f"class_weights must be [V]={weight.shape[0]}; got {tuple(class_weights.shape)}")
    requested_backend()
    backend = _flce_backend(hidden, weight)
    loss, z_loss, n_correct, argmax = FusedLinearCrossEntropyFunction.apply(
        hidden,
        weight,
        target,
        bias,
        ignore_index,
        float(label_smoothing),
        None if softcap is None else float(softcap),
        float(logit_scale),
        float(lse_square_scale),
        reduction,
        class_weights,
        accum_dtype,
        chunk_mem_const,
        backend,
    )
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return loss
    acc = None
    if return_token_accuracy:
        n_valid = (target != ignore_index).sum().clamp(min=1)
        acc = n_correct.to(torch.float32) / n_valid
    return FLCEOutput(
        loss,
        z_loss if return_z_loss else None,
        acc,
        argmax if return_predicted_tokens else None,
    )
