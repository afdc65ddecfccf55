"""The RL head's PyTorch twin: the fold of one logits tile into the per-token statistics, the logits gradient of
one tile, and the plain full-logits reference.

* ``transform(x, softcap, scale)``: ``softcap * tanh(x * scale / softcap)`` (``x * scale`` without a softcap), in
  fp32; the temperature is already folded into ``softcap`` and ``scale`` (``c / T``, ``s / T``).
* ``fold_tile_torch``: the contract of the Triton fold kernel: running max, sum of exp, sum of exp * z, sum of
  exp^2, sum of z, the first argmax and the target's logit, updated in place with one tile of columns.
* ``grad_tile_torch``: the contract of the Triton gradient kernel: the tile becomes d loss / d raw logits.
* ``rl_head_reference`` / ``logit_stats``: every statistic from full fp32 logits under autograd (the tests'
  reference).
"""

from __future__ import annotations

import torch

from .stats import RowState


def transform(
    x: torch.Tensor, softcap: float | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 ``z`` of raw logits and ``tanh`` of the softcap (None without one), for the derivative."""
    y = x.float() * scale
    if softcap is None:
        return y, None
    t = torch.tanh(y / softcap)
    return softcap * t, t


@torch.no_grad()
def fold_tile_torch(tile, target, state: RowState, col0: int, softcap, scale, flags) -> None:
    """Fold the logits ``tile`` [n, c] (columns ``col0 .. col0 + c`` of the vocabulary) into ``state``."""
    z, _ = transform(tile, softcap, scale)
    c = z.shape[1]
    tile_max, tile_arg = z.max(-1)  # max returns the first maximal column
    new_m = torch.maximum(state.m, tile_max)
    a = torch.exp(state.m - new_m)
    e = torch.exp(z - new_m[:, None])
    state.d.mul_(a).add_(e.sum(-1))
    if flags.entropy:
        state.xs.mul_(a).add_((e * z).sum(-1))
    if flags.log_sum_sq_probs:
        state.sq.mul_(a * a).add_((e * e).sum(-1))
    if flags.mean_logits:
        state.zs.add_(z.sum(-1))
    if flags.is_top1:  # strictly greater: an earlier tile keeps a tie
        state.arg.copy_(torch.where(tile_max > state.m, tile_arg + col0, state.arg))
    state.m.copy_(new_m)
    local = target - col0
    inside = (local >= 0) & (local < c)
    picked = z.gather(1, local.clamp(0, c - 1)[:, None])[:, 0]
    state.zt.copy_(torch.where(inside, picked, state.zt))


@torch.no_grad()
def grad_tile_torch(tile, target, log_z, entropy, g_lp, g_ent, col0: int, softcap, scale) -> None:
    """Overwrite ``tile`` with d loss / d raw logits: ``g_lp (onehot - p) - g_ent p (log p + H)`` through the
    transform (``g_lp`` / ``g_ent`` None when that output has no gradient)."""
    z, t = transform(tile, softcap, scale)
    log_p = z - log_z[:, None]
    p = torch.exp(log_p)
    g = torch.zeros_like(z)
    if g_lp is not None:
        g -= g_lp[:, None] * p
        local = target - col0
        inside = (local >= 0) & (local < z.shape[1])
        g.scatter_add_(1, local.clamp(0, z.shape[1] - 1)[:, None], (g_lp * inside)[:, None].float())
    if g_ent is not None:
        g -= g_ent[:, None] * p * (log_p + entropy[:, None])
    g = g * scale if t is None else g * (scale * (1 - t * t))
    tile.copy_(g)


def rl_head_reference(hidden, weight, target, bias=None, *, temperature=1.0, softcap=None, logit_scale=1.0):
    """``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)`` [N] from the full fp32 logits
    ``softcap(logit_scale * (hidden @ weight.T + bias)) / temperature``, differentiable (the tests' reference)."""
    x = hidden.float() @ weight.float().t()
    if bias is not None:
        x = x + bias.float()
    z = x * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return logit_stats(z / temperature, target)


def logit_stats(z: torch.Tensor, target: torch.Tensor):
    """Every output from transformed logits ``z`` [N, V] (fp32 math; log_probs and entropy differentiable)."""
    z = z.float()
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    lp = logp.gather(-1, target[:, None])[:, 0]
    entropy = -(p * logp).sum(-1)
    log_sum_sq = torch.logsumexp(2 * logp, -1).detach()
    return lp, entropy, log_sum_sq, z.mean(-1).detach(), z.argmax(-1) == target
