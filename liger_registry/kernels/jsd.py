"""Fused linear generalised Jensen-Shannon divergence (distillation), chunked over tokens.

As Liger defines it, with student log-probs ``X = log_softmax(s / T)`` and teacher log-probs
``Y = log_softmax(t / T)`` (``Q = exp X``, ``P = exp Y``): ``beta = 0`` is forward KL ``KL(P || Q)``,
``beta = 1`` reverse KL ``KL(Q || P)``, otherwise with ``M = beta P + (1 - beta) Q`` the loss is
``beta KL(P || M) + (1 - beta) KL(Q || M)``. Summed over the vocabulary, averaged over the non-ignored
tokens (all tokens when ``target`` is None). Gradients flow to the student only.
"""

from __future__ import annotations

import torch

from .flce import check_chunk_mem_const, flce_chunk_geometry


def jsd_rows_differentiable(s_logits, t_logits, beta: float, temperature: float) -> torch.Tensor:
    """Per-row generalised JSD (fp32, autograd) - the plain reference."""
    x = torch.log_softmax(s_logits.float() / temperature, -1)
    y = torch.log_softmax(t_logits.float() / temperature, -1)
    if beta == 0.0:
        return (y.exp() * (y - x)).sum(-1)
    if beta == 1.0:
        return (x.exp() * (x - y)).sum(-1)
    q, p = x.exp(), y.exp()
    log_m = torch.log(beta * p + (1 - beta) * q)
    return beta * (p * (y - log_m)).sum(-1) + (1 - beta) * (q * (x - log_m)).sum(-1)


@torch.no_grad()
def jsd_rows_torch(s_buf, t_buf, valid, *, beta: float, temperature: float, grad_scale, compute_grad: bool):
    """Per-row loss (fp32, 0 on invalid rows); with ``compute_grad`` s_buf becomes d loss / d student logits."""
    x = torch.log_softmax(s_buf.float() / temperature, -1)
    y = torch.log_softmax(t_buf.float() / temperature, -1)
    q = x.exp()
    if beta == 0.0:
        p = y.exp()
        loss = (p * (y - x)).sum(-1)
        dx = -p
    elif beta == 1.0:
        loss = (q * (x - y)).sum(-1)
        dx = q * (x - y) + q
    else:
        p = y.exp()
        m = beta * p + (1 - beta) * q
        log_m = torch.log(m)
        loss = beta * (p * (y - log_m)).sum(-1) + (1 - beta) * (q * (x - log_m)).sum(-1)
        dx = (1 - beta) * q * (x - log_m)
    vf = valid.to(torch.float32)
    loss = loss * vf
    if compute_grad:
        g = (dx - q * dx.sum(-1, keepdim=True)) * (vf * grad_scale / temperature)[:, None]
        s_buf.copy_(g)
    return loss


def _jsd_rows(backend: str):
    if backend == "triton":
        from .triton_jsd import jsd_rows_triton

        return jsd_rows_triton
    return jsd_rows_torch


def fljsd_compute(sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend):
    """One pass over token chunks: (mean loss, d loss/d student hidden, d loss/d student weight)."""
    n, h = sh.shape
    v = sw.shape[0]
    valid = torch.ones(n, dtype=torch.bool, device=sh.device) if target is None else target != ignore_index
    n_valid = valid.sum().to(torch.float32)
    scale = torch.where(n_valid > 0, 1.0 / n_valid.clamp(min=1.0), torch.zeros_like(n_valid))
    chunk, nchunks = flce_chunk_geometry(n, max(h, th.shape[1]), v, chunk_mem_const)
    dh = torch.empty(sh.shape, dtype=sh.dtype, device=sh.device) if need_dh else None
    dw = torch.zeros(sw.shape, dtype=sw.dtype, device=sw.device) if need_dw else None
    sw_c = sw if sw.dtype == sh.dtype else sw.to(sh.dtype)
    tw_c = tw if tw.dtype == th.dtype else tw.to(th.dtype)
    rows = _jsd_rows(backend)
    total = torch.zeros((), dtype=torch.float32, device=sh.device)
    s_buf = t_buf = None
    for i in range(nchunks):
        s, e = i * chunk, min((i + 1) * chunk, n)
        if s_buf is None:
            s_buf = torch.empty((chunk, v), dtype=sh.dtype, device=sh.device)
            t_buf = torch.empty((chunk, v), dtype=th.dtype, device=th.device)
        sb, tb = s_buf[: e - s], t_buf[: e - s]
        torch.mm(sh[s:e], sw_c.t(), out=sb)
        torch.mm(th[s:e], tw_c.t(), out=tb)
        loss_rows = rows(
            sb, tb, valid[s:e], beta=beta, temperature=temperature, grad_scale=scale, compute_grad=need_dh or need_dw
        )
        total += loss_rows.sum()
        if need_dh:
            torch.mm(sb, sw_c, out=dh[s:e])
        if need_dw:
            if dw.dtype == sb.dtype:
                dw.addmm_(sb.t(), sh[s:e])
            else:
                dw.addmm_(sb.t().to(dw.dtype), sh[s:e].to(dw.dtype))
    return total * scale, dh, dw


class FusedLinearJSDFunction(torch.autograd.Function):
    """``(student_hidden, student_weight, teacher_hidden, teacher_weight, target, jsd_beta, temperature,
    ignore_index, chunk_mem_const, backend)`` -> scalar loss. Gradients computed in forward (custom op
    ``liger_registry::fljsd_forward``), scaled by grad_output in backward."""

    @staticmethod
    def forward(ctx, sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, backend):
        from .custom_ops_loss import fljsd_forward

        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        loss, dh, dw = fljsd_forward(
            sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend
        )
        ctx.flags = (need_dh, need_dw)
        ctx.save_for_backward(dh, dw)
        return loss

    @staticmethod
    def backward(ctx, go):
        dh, dw = ctx.saved_tensors
        need_dh, need_dw = ctx.flags
        dh = dh * go.to(dh.dtype) if need_dh else None
        dw = dw * go.to(dw.dtype) if need_dw else None
        return dh, dw, None, None, None, None, None, None, None, None


def fused_linear_jsd(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    jsd_beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_mem_const: int = 1,
) -> torch.Tensor:
    """Generalised JSD between student and teacher heads (see the module docstring), chunked over tokens
    with its own ``chunk_mem_const`` (the same formula as FLCE's geometry; an independent knob)."""
    check_chunk_mem_const(chunk_mem_const)
    if not 0.0 <= float(jsd_beta) <= 1.0:
        raise ValueError(f"jsd_beta must be in [0, 1], got {jsd_beta}")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_hidden.dim() != 2 or teacher_hidden.dim() != 2 or student_hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(
            f"student_hidden and teacher_hidden must be [N, H*] with the same N; got "
            f"{tuple(student_hidden.shape)} and {tuple(teacher_hidden.shape)}"
        )
    if student_weight.shape[1] != student_hidden.shape[1] or teacher_weight.shape[1] != teacher_hidden.shape[1]:
        raise ValueError("weights must be [V, H] matching their hidden states")
    if student_weight.shape[0] != teacher_weight.shape[0]:
        raise ValueError(f"student and teacher vocabularies differ: {student_weight.shape[0]} vs {teacher_weight.shape[0]}")
    if target is not None and target.shape != (student_hidden.shape[0],):
        raise ValueError(f"target must be [N]; got {tuple(target.shape)}")
    from .op import OPS

    backend = OPS["fused_linear_jsd"].choose(student_hidden, student_weight, teacher_hidden, teacher_weight)
    return FusedLinearJSDFunction.apply(
        student_hidden,
        student_weight,
        teacher_hidden.detach(),
        teacher_weight.detach(),
        target,
        float(jsd_beta),
        float(temperature),
        ignore_index,
        chunk_mem_const,
        backend,
    )
