"""Per-token log-probs together with the entropy of each token's next-token distribution, through the head chunk
by chunk: what the RL losses need for an entropy mask or an entropy bonus.

Cross entropy alone gives ``log p(target)``; the entropy ``H = -sum_v p_v log p_v`` needs the whole row, and its
gradient ``dH/dz_v = -p_v (log p_v + H)`` too. As in :func:`token_log_probs`, the forward keeps only its inputs
and the backward recomputes each chunk's logits, so one chunk of logits (in fp32, with its softmax) exists at a
time. Tokens whose target is ``ignore_index`` never reach the head. The chunks run as PyTorch GEMMs on any
device; the chunk is the token chunk FLCE plans for the same budget (``chunk_mem_const`` / ``max_chunk_mib``),
sized for fp32 logits; the weight gradient accumulates in ``accum_dtype`` (the weight's dtype unless set, as
in FLCE).
"""

from __future__ import annotations

import torch

from liger_registry.kernels import flce_plan

from .head_options import HeadOptions
from .logprobs import TokenLogProbs, _check, _options


def _logits(h, weight, bias, scale: float, softcap: float | None):
    """fp32 ``softcap((h @ W.T + b) * scale)`` of one chunk, and its derivative in the raw logits."""
    x = (h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())).float()
    if softcap is None:
        return x * scale, None
    t = torch.tanh(x * (scale / softcap))
    return softcap * t, scale * (1 - t * t)


def _rows(z: torch.Tensor, target: torch.Tensor):
    logp = torch.log_softmax(z, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp, logp.gather(-1, target[:, None])[:, 0], entropy


class _LogProbEntropy(torch.autograd.Function):
    """``(rows [N, H], weight [V, H], bias [V] | None, target [N], scale, softcap, chunk)`` ->
    ``(log p(target) [N], entropy [N])``, both fp32 and differentiable; the weight gradient accumulates in
    ``accum_dtype``."""

    @staticmethod
    def forward(ctx, rows, weight, bias, target, scale, softcap, chunk, accum_dtype):
        n = rows.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=rows.device)
        ent = torch.empty_like(lp)
        w = weight.to(rows.dtype)
        b = None if bias is None else bias.to(rows.dtype)
        for s in range(0, n, chunk):
            z, _ = _logits(rows[s : s + chunk], w, b, scale, softcap)
            _, lp[s : s + chunk], ent[s : s + chunk] = _rows(z, target[s : s + chunk])
        ctx.save_for_backward(rows, weight, bias, target, ent)
        ctx.scale, ctx.softcap, ctx.chunk, ctx.accum_dtype = scale, softcap, chunk, accum_dtype
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        rows, weight, bias, target, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None
        need_b = need_b and ctx.needs_input_grad[2]
        w = weight.to(rows.dtype)
        b = None if bias is None else bias.to(rows.dtype)
        dh = torch.empty_like(rows) if need_h else None
        dw = torch.zeros(weight.shape, dtype=ctx.accum_dtype, device=rows.device) if need_w else None
        db = torch.zeros(weight.shape[0], dtype=torch.float32, device=rows.device) if need_b else None
        for s in range(0, rows.shape[0], ctx.chunk):
            e = s + ctx.chunk
            h = rows[s:e]
            dz = _chunk_grad(h, w, b, target[s:e], ent[s:e], g_lp, g_ent, s, e, ctx)
            if need_h:
                dh[s:e] = dz.to(rows.dtype) @ w
            if need_w:
                dw.addmm_(dz.t().to(dw.dtype), h.to(dw.dtype))
            if need_b:
                db += dz.sum(0)
        dw = None if dw is None else dw.to(weight.dtype)
        db = None if db is None else db.to(bias.dtype)
        return dh, dw, db, None, None, None, None, None


def _chunk_grad(h, w, b, target, ent, g_lp, g_ent, s, e, ctx) -> torch.Tensor:
    """Gradient in the raw logits of one chunk: ``g_lp (onehot - p) - g_H p (log p + H)``, through the softcap."""
    z, dz_dx = _logits(h, w, b, ctx.scale, ctx.softcap)
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    dz = torch.zeros_like(z)
    if g_lp is not None:
        dz -= g_lp[s:e, None] * p
        dz.scatter_add_(-1, target[:, None], g_lp[s:e, None].float())
    if g_ent is not None:
        dz -= g_ent[s:e, None] * p * (logp + ent[:, None])
    return dz * ctx.scale if dz_dx is None else dz * dz_dx


def token_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    options: HeadOptions | None = None,
    **head_options,
) -> tuple[TokenLogProbs, torch.Tensor]:
    """:func:`token_log_probs` and the entropy [B, T] (fp32, 0 where masked) of each counted token's next-token
    distribution ``softmax(softcap((hidden @ weight.T + bias) * scale) / temperature)``, both differentiable in
    hidden, weight and bias, never materialising [B*T, V]."""
    options = _options(options, head_options)
    _check(hidden, weight, target, bias)
    target = target.to(device=hidden.device, dtype=torch.int64)
    mask = target != options.ignore_index
    flat = mask.reshape(-1)
    rows = hidden.reshape(-1, hidden.shape[-1])[flat]
    fl = options.flce()
    n, v = rows.shape[0], weight.shape[0]
    plan = flce_plan(
        max(n, 1), rows.shape[1], v, chunk_mem_const=fl.chunk_mem_const, max_chunk_mib=fl.max_chunk_mib,
        strategy="tokens", dtype=torch.float32,
    )  # fmt: skip
    lp, ent = _LogProbEntropy.apply(
        rows, weight, bias, target.reshape(-1)[flat], fl.logit_scale, fl.softcap, max(plan.chunk_tokens, 1),
        fl.accum_dtype or weight.dtype,
    )  # fmt: skip
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    return TokenLogProbs(zeros.masked_scatter(mask, lp), mask), zeros.masked_scatter(mask, ent)
