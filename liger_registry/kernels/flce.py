"""Fused linear cross entropy: loss of ``softcap((hidden @ W.T + b) * scale)`` chunked over tokens."""

from __future__ import annotations

import math
import os
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


def _addmm_dw(dw: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> None:
    """dw += g.T @ h, written straight into the accumulator (fp32 accumulation without upcast copies)."""
    if dw.dtype == g.dtype == h.dtype:
        dw.addmm_(g.t(), h)
        return
    if dw.is_cuda and dw.dtype == torch.float32 and g.dtype == h.dtype and g.dtype in (torch.float16, torch.bfloat16):
        try:
            torch.addmm(dw, g.t(), h, out_dtype=torch.float32, out=dw)
            return
        except (TypeError, RuntimeError):
            pass
    dw.addmm_(g.t().to(dw.dtype), h.to(dw.dtype))


def _accumulate_dw(dw: torch.Tensor, g: torch.Tensor, h: torch.Tensor, first: bool) -> None:
    if first:
        torch.mm(g.t(), h, out=dw)
    else:
        _addmm_dw(dw, g, h)


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SIDE_STREAMS:
        _SIDE_STREAMS[key] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[key]


def _overlap_streams(device: torch.device) -> bool:
    """dX GEMM (compute-bound) and dW addmm (memory-bound at small chunks) on two streams. Off by default: on the
    H200 it gained <0.3% at chunk 256 and lost up to 2.5% at chunk 4096 (benchmarks/results/bench_flce.json)."""
    return device.type == "cuda" and os.environ.get("LIGER_REGISTRY_FLCE_OVERLAP", "0") == "1"


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
    argmax_mode: int = 2,
):
    """One pass over the chunks. Returns ``(loss, z_loss, n_correct, argmax, dh, dw, db)``.

    ``loss``/``z_loss`` are reduced (or per token for ``none``); gradients are those of ``loss`` (times
    ``row_grad`` per token when given), ``None`` where not needed. One logits buffer is reused for every
    chunk; the CE kernel overwrites it with the logits gradient (scaling fused in), dX chunks are written
    straight into the output and dW is accumulated by ``addmm`` into one accumulator.
    """
    n, h = hidden.shape
    v = weight.shape[0]
    device = hidden.device
    w_dt = weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)
    valid, n_valid, denom = ce_torch.denominators(target, ignore_index, class_weights)
    if argmax_mode == 0:
        valid = None  # not needed below: keep the step's transient memory minimal
    if reduction == "mean":
        ce_scale = torch.where(denom > 0, 1.0 / denom.clamp(min=1e-30), torch.zeros_like(denom))
        z_scale = 1.0 / n_valid.clamp(min=1.0)
    else:
        ce_scale = 1.0
        z_scale = 1.0
    chunk, nchunks = flce_chunk_geometry(n, h, v, chunk_mem_const)
    # per-row outputs: z-loss and argmax rows only when they are asked for (ce rows are written in their place)
    has_z = float(lse_square_scale) != 0.0
    per_token = reduction == "none"
    if per_token:
        ce_all = torch.empty(n, dtype=torch.float32, device=device)
        z_all = torch.empty(n, dtype=torch.float32, device=device) if has_z else None
    else:
        # mean/sum: one chunk-sized row buffer, reduced per chunk into [num_chunks] partial sums (deterministic)
        ce_rows_buf = torch.empty(max(chunk, 1), dtype=torch.float32, device=device)
        z_rows_buf = torch.empty(max(chunk, 1), dtype=torch.float32, device=device) if has_z else None
        ce_part = torch.zeros(max(nchunks, 1), dtype=torch.float32, device=device)
        z_part = torch.zeros(max(nchunks, 1), dtype=torch.float32, device=device) if has_z else None
    argmax_all = torch.zeros(n, dtype=torch.long, device=device) if argmax_mode else None
    compute_grad = need_dh or need_dw or need_db
    dh = torch.empty((n, h), dtype=hidden.dtype, device=device) if need_dh else None
    acc_dtype = accum_dtype if accum_dtype is not None else weight.dtype
    # dW: the first chunk writes it with a plain GEMM (no memset, no read); later chunks addmm into it
    dw_direct = need_dw and acc_dtype == hidden.dtype and n > 0
    if need_dw:
        dw = torch.empty(weight.shape, dtype=acc_dtype, device=device) if dw_direct else torch.zeros(
            weight.shape, dtype=acc_dtype, device=device)
    else:
        dw = None
    db = torch.zeros(v, dtype=torch.float32, device=device) if need_db else None
    ce_rows = _ce_rows(backend)
    extra = {}
    if backend == "triton":
        from .triton_ce import make_scales

        extra["scales"] = make_scales(ce_scale, z_scale, class_weights, device)
    overlap = compute_grad and need_dh and need_dw and _overlap_streams(device)
    if overlap:
        main = torch.cuda.current_stream(device)
        side = _side_stream(device)
    buf_full = torch.empty((chunk, v), dtype=hidden.dtype, device=device) if n else None
    buf = None
    for i in range(nchunks):
        s, e = i * chunk, min((i + 1) * chunk, n)
        h_c = hidden[s:e]
        buf = buf_full[: e - s]
        if bias is not None:
            torch.addmm(bias.to(hidden.dtype), h_c, w_dt.t(), out=buf)
        else:
            torch.mm(h_c, w_dt.t(), out=buf)
        ce_rows(
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
            argmax_mode=argmax_mode,
            out=(
                ce_all[s:e] if per_token else ce_rows_buf[: e - s],
                (z_all[s:e] if per_token else z_rows_buf[: e - s]) if has_z else None,
                argmax_all[s:e] if argmax_mode else None,
            ),
            **extra,
        )
        if not per_token:
            torch.sum(ce_rows_buf[: e - s], 0, keepdim=True, out=ce_part[i : i + 1])
            if has_z:
                torch.sum(z_rows_buf[: e - s], 0, keepdim=True, out=z_part[i : i + 1])
        if not compute_grad:
            continue
        if overlap:
            # dX on a side stream while dW's addmm (memory-bound at small chunks) runs on the main one; both only
            # read the gradient buffer, and the next chunk's logits GEMM waits for the side stream.
            side.wait_stream(main)
            with torch.cuda.stream(side):
                torch.mm(buf, w_dt, out=dh[s:e])
            _accumulate_dw(dw, buf, h_c, first=dw_direct and i == 0)
            if need_db:
                db += buf.sum(0, dtype=torch.float32)
            main.wait_stream(side)
            continue
        if need_dh:
            torch.mm(buf, w_dt, out=dh[s:e])
        if need_dw:
            _accumulate_dw(dw, buf, h_c, first=dw_direct and i == 0)
        if need_db:
            db += buf.sum(0, dtype=torch.float32)
    if overlap and buf_full is not None:
        buf_full.record_stream(side)
        dh.record_stream(side)
    del buf, buf_full
    zero = torch.zeros((), dtype=torch.float32, device=device)
    if per_token:
        z_loss = z_all if has_z else torch.zeros_like(ce_all)
        loss = ce_all + z_all if has_z else ce_all
    else:
        ce_sum = ce_part.sum()
        z_sum = z_part.sum() if has_z else zero
        if reduction == "sum":
            z_loss = z_sum
            loss = ce_sum + z_sum
        else:
            z_loss = z_sum * z_scale if has_z else zero
            loss = ce_sum * ce_scale + z_loss
    if argmax_mode:
        n_correct = ((argmax_all == target) & valid).sum()
    else:
        n_correct = torch.zeros((), dtype=torch.long, device=device)
    if argmax_all is None:
        argmax_all = torch.empty(0, dtype=torch.long, device=device)
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    if db is not None and bias is not None:
        db = db.to(bias.dtype)
    return loss, z_loss, n_correct, argmax_all, dh, dw, db


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd Function of FLCE. Stable positional signature; new arguments go last, with defaults:

    ``(hidden, weight, target, bias, ignore_index, label_smoothing, softcap, logit_scale, lse_square_scale,
    reduction, class_weights, accum_dtype, chunk_mem_const, backend, argmax_mode)``
    -> ``(loss, z_loss, n_correct, argmax)``.

    For ``mean``/``sum`` the forward computes the gradients chunk by chunk and the backward only scales them by
    ``grad_output`` (in place; call backward once); for ``none`` the forward keeps the inputs and the backward
    recomputes per chunk with the per-token ``grad_output`` (the only exact way without storing [N, V]).
    The work happens in ``torch.ops.liger_registry.flce_forward``, an opaque custom op for torch.compile.
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
        argmax_mode=2,
    ):
        from .custom_ops_loss import flce_forward

        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_db = bias is not None and ctx.needs_input_grad[3]
        eager = reduction != "none"
        opts = (ignore_index, label_smoothing, softcap, logit_scale, lse_square_scale, reduction, accum_dtype,
                chunk_mem_const)
        loss, z_loss, n_correct, argmax, dh, dw, db = flce_forward(
            hidden, weight, target, bias, class_weights, None, *opts,
            need_dh and eager, need_dw and eager, need_db and eager, argmax_mode, backend,
        )
        ctx.eager = eager
        ctx.flags = (need_dh, need_dw, need_db)
        ctx.opts = opts
        ctx.backend = backend
        if eager:
            ctx.save_for_backward(dh, dw, db)
        else:
            ctx.save_for_backward(hidden, weight, target, bias, class_weights)
        ctx.mark_non_differentiable(z_loss, n_correct, argmax)
        return loss, z_loss, n_correct, argmax

    @staticmethod
    def backward(ctx, grad_loss, *_):
        from .custom_ops_loss import flce_forward, flce_scale_grads_

        need_dh, need_dw, need_db = ctx.flags
        if ctx.eager:
            dh, dw, db = ctx.saved_tensors
            flce_scale_grads_(dh, dw, db, grad_loss)
        else:
            hidden, weight, target, bias, class_weights = ctx.saved_tensors
            _, _, _, _, dh, dw, db = flce_forward(
                hidden, weight, target, bias, class_weights, grad_loss, *ctx.opts,
                need_dh, need_dw, need_db, 0, ctx.backend,
            )
        return (dh if need_dh else None, dw if need_dw else None, None, db if need_db else None) + (None,) * 11


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
    from .op import OPS

    ce_torch.check_ce_options(label_smoothing, softcap, reduction)
    check_chunk_mem_const(chunk_mem_const)
    if not float(logit_scale) > 0.0:
        raise ValueError(f"logit_scale must be > 0, got {logit_scale}")
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
    backend = OPS["fused_linear_cross_entropy"].choose(hidden, weight)
    argmax_mode = 2 if return_predicted_tokens else (1 if return_token_accuracy else 0)
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
        argmax_mode,
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
