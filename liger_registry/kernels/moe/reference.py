"""MoE experts in PyTorch, forward and explicit backward, over the sorted rows of a :class:`~.routing.Route`.

* ``experts_fwd_torch`` / ``experts_bwd_torch``: the CPU path, the reference of the Triton kernels, and the
  torch branch of the op (autograd does not record inside a custom op's implementation, so the backward is
  written out).
* Computes what transformers' grouped experts compute, op for op: per expert ``gate_up = x @ W_gu^T (+ b)``, the
  family's gate (``gate`` / ``gate_grad``), ``y = h @ W_d^T (+ b)``, ``y * routing weight``, summed over the
  top-k slots of each token. Separate gate and up weights (``w_up``) are joined one expert at a time, never as a
  whole-weight copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..glu.reference import glu_fused_torch, swiglu_clamped_torch, swiglu_limited_torch


def _linear(x: torch.Tensor, w: torch.Tensor, out_first: bool) -> torch.Tensor:
    return F.linear(x, w) if out_first else x @ w


def _expert_gate_up(w_gu: torch.Tensor, w_up: torch.Tensor | None, e: int, out_first: bool) -> torch.Tensor:
    """Expert ``e``'s gate/up matrix: its slice of ``w_gu``, or the gate's and the up's joined (gate first)."""
    return w_gu[e] if w_up is None else torch.cat([w_gu[e], w_up[e]], 0 if out_first else 1)


def _segments(offsets: torch.Tensor):
    bounds = offsets.tolist()
    return [(e, lo, hi) for e, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)) if hi > lo]


def gate(gate_up: torch.Tensor, act: str, limit: float, alpha: float) -> torch.Tensor:
    if act == "clamped_swiglu":
        return swiglu_clamped_torch(gate_up, limit, alpha)
    if act == "limited_swiglu":
        return swiglu_limited_torch(gate_up, limit)
    return glu_fused_torch(gate_up, act)


def gate_grad(dh: torch.Tensor, gate_up: torch.Tensor, act: str, limit: float, alpha: float) -> torch.Tensor:
    """d gate_up of :func:`gate`, in fp32 then the gate_up's dtype."""
    d = dh.float()
    if act == "clamped_swiglu":
        a, b = gate_up[..., ::2].float(), gate_up[..., 1::2].float()
        g, u = a.clamp(max=limit), b.clamp(-limit, limit)
        sig = torch.sigmoid(g * alpha)
        da = torch.where(a <= limit, (u + 1) * (sig + g * alpha * sig * (1 - sig)), 0.0)
        db = torch.where((b >= -limit) & (b <= limit), g * sig, 0.0)
        return torch.stack([d * da, d * db], -1).flatten(-2).to(gate_up.dtype)
    a, b = (t.float() for t in gate_up.chunk(2, dim=-1))
    if act == "limited_swiglu":
        g, u = a.clamp(max=limit), b.clamp(-limit, limit)
        sig = torch.sigmoid(g)
        da = torch.where(a <= limit, u * sig * (1 + g * (1 - sig)), 0.0)
        db = torch.where((b >= -limit) & (b <= limit), g * sig, 0.0)
        return torch.cat([d * da, d * db], -1).to(gate_up.dtype)
    if act == "swiglu":
        sig = torch.sigmoid(a)
        act_a, dact = a * sig, sig * (1 + a * (1 - sig))
    else:
        k = 0.7978845608028654
        t = torch.tanh(k * (a + 0.044715 * a**3))
        act_a = 0.5 * a * (1 + t)
        dact = 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a)
    return torch.cat([d * b * dact, d * act_a], -1).to(gate_up.dtype)


def experts_fwd_torch(x, weights, w_gu, w_d, b_gu, b_d, w_up, src, dest, offsets, top_k, act, limit, alpha,
                out_first):  # fmt: skip
    """``(out [T, H], gate_up [S, 2I], h [S, I])``; ``weights``: the routing weight of each sorted row."""
    n_rows = src.shape[0]
    xs = x[src.long()]
    inter = w_d.shape[2] if out_first else w_d.shape[1]
    gate_up = x.new_empty(n_rows, 2 * inter)
    h = x.new_empty(n_rows, inter)
    y = x.new_empty(n_rows, x.shape[1])
    for e, lo, hi in _segments(offsets):
        gu = _linear(xs[lo:hi], _expert_gate_up(w_gu, w_up, e, out_first), out_first)
        gate_up[lo:hi] = gu if b_gu is None else gu + b_gu[e]
        h[lo:hi] = gate(gate_up[lo:hi], act, limit, alpha)
        ye = _linear(h[lo:hi], w_d[e], out_first)
        y[lo:hi] = ye if b_d is None else ye + b_d[e]
    weighted = y * weights.unsqueeze(-1)
    buf = weighted.new_empty(weighted.shape)
    buf[dest.long()] = weighted
    out = buf.view(-1, top_k, x.shape[1]).sum(1).to(x.dtype)
    return out, gate_up, h


def experts_bwd_torch(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, src, dest, offsets, top_k, act, limit,
                alpha, out_first):  # fmt: skip
    """``(dx, d weights (sorted rows, fp32), d w_gu, d w_d, d b_gu, d b_d, d w_up)``; the gradient of an absent
    bias or up weight is an empty tensor."""
    src_l = src.long()
    xs, dys = x[src_l], dout[src_l]
    dx_rows = torch.zeros(src.shape[0], x.shape[1], dtype=dout.dtype, device=x.device)
    d_weights = torch.zeros(src.shape[0], dtype=torch.float32, device=x.device)
    dw_gu, dw_d = torch.zeros_like(w_gu), torch.zeros_like(w_d)
    db_gu = torch.zeros_like(b_gu) if b_gu is not None else x.new_empty(0)
    db_d = torch.zeros_like(b_d) if b_d is not None else x.new_empty(0)
    dw_up = torch.zeros_like(w_up) if w_up is not None else x.new_empty(0)
    for e, lo, hi in _segments(offsets):
        ye = _linear(h[lo:hi], w_d[e], out_first)
        if b_d is not None:
            ye = ye + b_d[e]
        d_weights[lo:hi] = (dys[lo:hi].float() * ye.float()).sum(-1)
        dy = dys[lo:hi] * weights[lo:hi].unsqueeze(-1).to(dys.dtype)
        dh = dy @ w_d[e] if out_first else F.linear(dy, w_d[e])
        dw_d[e] = dy.t() @ h[lo:hi] if out_first else h[lo:hi].t() @ dy
        dgu = gate_grad(dh, gate_up[lo:hi], act, limit, alpha)
        w_gu_e = _expert_gate_up(w_gu, w_up, e, out_first)
        dx_rows[lo:hi] = dgu @ w_gu_e if out_first else F.linear(dgu, w_gu_e)
        dw = dgu.t() @ xs[lo:hi] if out_first else xs[lo:hi].t() @ dgu
        if w_up is None:
            dw_gu[e] = dw
        else:
            dw_gu[e], dw_up[e] = dw.chunk(2, 0 if out_first else 1)
        if b_gu is not None:
            db_gu[e] = dgu.sum(0)
        if b_d is not None:
            db_d[e] = dy.sum(0)
    buf = torch.empty_like(dx_rows)
    buf[dest.long()] = dx_rows
    dx = buf.view(-1, top_k, x.shape[1]).sum(1).to(x.dtype)
    return dx, d_weights, dw_gu, dw_d, db_gu, db_d, dw_up
