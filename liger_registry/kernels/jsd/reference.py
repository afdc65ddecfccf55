"""Generalised JSD rows in PyTorch: the reference of the Triton rows kernel and the op's ``torch`` backend.

* ``jsd_rows_differentiable(s, t, beta, T)``: per-row loss in fp32 under autograd (the plain reference).
* ``jsd_rows_torch(...)``: the Triton kernel's contract: per-row loss (0 on invalid rows) and, with
  ``compute_grad``, the student-logit gradient written over ``s_buf``.

The definition of the loss is in ``op``.
"""

from __future__ import annotations

import torch


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
