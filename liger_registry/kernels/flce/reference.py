"""Row math of the FLCE vocabulary strategy in PyTorch: the twin of ``triton_kernels``.

* ``stats_update_torch``: fold a chunk into the running row statistics (:class:`RowState`).
* :func:`row_losses`: per-row loss and gradient coefficients (:class:`RowCoefs`) from the statistics.
* ``grad_inplace_torch``: the in-place gradient of a chunk, the token strategy's (``ce.reference.ce_rows_torch``):
  ``(exp(z - lse) * coef - [j == y] * a_s - sm * w_j) * (1 - tanh^2) * logit_scale`` with the per-row ``coef``,
  ``a_s``, ``sm`` (zero on ignored rows, so their gradient is exactly 0); ``z = softcap(raw * logit_scale)``,
  ``lse = m + log(d)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..ce.reference import transform_logits
from .target import corrected_lse


class RowState(NamedTuple):
    """Running statistics of every row over the vocabulary chunks seen so far (fp32 [N]; ``best_i`` int64)."""

    m: torch.Tensor  # running max of z
    d: torch.Tensor  # sum of exp(z - m)
    zy: torch.Tensor  # z at the target column (0 until its chunk is seen)
    sz: torch.Tensor  # sum of z (weighted by the class weights when given), for label smoothing
    best: torch.Tensor  # running max for argmax (== m; kept apart so argmax ties resolve to the first index)
    best_i: torch.Tensor  # its column


def new_state(n: int, device) -> RowState:
    f32 = torch.float32
    return RowState(
        torch.full((n,), float("-inf"), dtype=f32, device=device),
        torch.zeros(n, dtype=f32, device=device),
        torch.zeros(n, dtype=f32, device=device),
        torch.zeros(n, dtype=f32, device=device),
        torch.full((n,), float("-inf"), dtype=f32, device=device),
        torch.zeros(n, dtype=torch.long, device=device),
    )


class RowCoefs(NamedTuple):
    """Per-row factors of the gradient (fp32 [N]); see the module docstring."""

    lse: torch.Tensor
    coef: torch.Tensor
    a_s: torch.Tensor
    sm: torch.Tensor


@torch.no_grad()
def stats_update_torch(buf, col0: int, target, state: RowState, *, opts, class_weights, argmax: bool) -> None:
    """Folds the chunk ``buf`` [N, w] (raw logits of columns ``col0 .. col0 + w``) into ``state``, in place."""
    z = transform_logits(buf, opts.softcap, opts.logit_scale)
    width = z.shape[1]
    bm, bi = z.max(-1)
    m_new = torch.maximum(state.m, bm)
    state.d.mul_(torch.exp(state.m - m_new)).add_(torch.exp(z - m_new[:, None]).sum(-1))
    state.m.copy_(m_new)
    local = target - col0
    inside = (local >= 0) & (local < width)
    picked = z.gather(1, local.clamp(0, width - 1)[:, None]).squeeze(1)
    state.zy.copy_(torch.where(inside, picked, state.zy))
    if opts.label_smoothing > 0.0:
        w = None if class_weights is None else class_weights[col0 : col0 + width].to(torch.float32)
        state.sz.add_(z.sum(-1) if w is None else (z * w).sum(-1))
    if argmax:
        better = bm > state.best
        state.best_i.copy_(torch.where(better, bi + col0, state.best_i))
        state.best.copy_(torch.maximum(state.best, bm))


def row_losses(
    state: RowState, target, v: int, *, opts, class_weights, ce_scale, z_scale, row_grad, zy_exact=None
):
    """Per-row ``(ce, z_loss)`` (0 on ignored rows) and the gradient factors :class:`RowCoefs`; ``zy_exact``
    (fp32 [N], ``target``) replaces the chunks' rounded target logit, in the loss and in the row's lse."""
    valid = target != opts.ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    lse = state.m + torch.log(state.d)
    zy = state.zy
    if zy_exact is not None:
        lse = torch.where(valid, corrected_lse(lse, zy, zy_exact), lse)
        zy = zy_exact
    eps = opts.label_smoothing
    if class_weights is None:
        w_y = torch.ones_like(lse)
        w_sum = float(v)
        smooth = lse - state.sz / v
    else:
        w = class_weights.to(torch.float32)
        w_y = w[safe]
        w_sum = w.sum()
        smooth = (w_sum * lse - state.sz) / v
    ce = (lse - zy) * w_y
    if eps:
        ce = (1.0 - eps) * ce + eps * smooth
    zl = opts.lse_square_scale * lse * lse
    rows = valid.to(torch.float32)
    if row_grad is not None:
        rows = rows * row_grad.to(torch.float32)
    a = (1.0 - eps) * w_y
    coef = ((a + eps * w_sum / v) * ce_scale + 2.0 * opts.lse_square_scale * lse * z_scale) * rows
    a_s = a * ce_scale * rows
    sm = (eps / v) * ce_scale * rows
    zero = torch.zeros((), dtype=torch.float32, device=lse.device)
    return torch.where(valid, ce, zero), torch.where(valid, zl, zero), RowCoefs(lse, coef, a_s, sm)


@torch.no_grad()
def grad_inplace_torch(buf, col0: int, target, coefs: RowCoefs, *, opts, class_weights) -> None:
    """Overwrites the chunk ``buf`` (raw logits) with d loss / d raw logits (see the module docstring)."""
    z = transform_logits(buf, opts.softcap, opts.logit_scale)
    width = z.shape[1]
    g = torch.exp(z - coefs.lse[:, None]) * coefs.coef[:, None]
    local = target - col0
    inside = (local >= 0) & (local < width)
    g.scatter_add_(1, local.clamp(0, width - 1)[:, None], torch.where(inside, -coefs.a_s, 0.0)[:, None])
    if opts.label_smoothing > 0.0:
        if class_weights is None:
            g -= coefs.sm[:, None]
        else:
            g -= coefs.sm[:, None] * class_weights[col0 : col0 + width].to(torch.float32)[None, :]
    if opts.softcap is not None:
        t = z / opts.softcap
        g *= 1.0 - t * t
    if opts.logit_scale != 1.0:
        g *= opts.logit_scale
    buf.copy_(g)
