"""Fused linear JSD: the chunk loop over tokens and the PyTorch row formulas (see ``api`` for the definition)."""

from __future__ import annotations

import torch

from ..flce.planner import flce_chunk_geometry
from .triton_rows import jsd_rows_triton


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


def jsd_rows_for(backend: str):
    """The row kernel for an already decided backend."""
    return jsd_rows_triton if backend == "triton" else jsd_rows_torch


def fljsd_compute(
    sh, sw, th, tw, target, beta, temperature, ignore_index, chunk_mem_const, need_dh, need_dw, backend
):
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
    rows = jsd_rows_for(backend)
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
            sb,
            tb,
            valid[s:e],
            beta=beta,
            temperature=temperature,
            grad_scale=scale,
            compute_grad=need_dh or need_dw,
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
