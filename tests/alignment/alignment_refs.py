"""Plain PyTorch formulas of the alignment losses on full logits (fp64), written from TRL's trainers, and the
random batches the tests feed both sides."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def batch(rows=4, seq=9, hidden=16, vocab=64, seed=0, bias=True, dtype=torch.float32):
    """(hidden [rows, seq, H], weight [V, H], bias [V] or None, target [rows, seq]): a 3-token prompt and
    padding of different lengths are ignore_index, as a collator leaves them."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, seq, hidden, generator=g, dtype=dtype)
    w = (torch.randn(vocab, hidden, generator=g) * hidden**-0.5).to(dtype)
    b = (torch.randn(vocab, generator=g) * 0.1).to(dtype) if bias else None
    t = torch.randint(0, vocab, (rows, seq), generator=g)
    t[:, :3] = IGNORE
    for r in range(rows):
        t[r, seq - (r % 3) :] = IGNORE
    return h.requires_grad_(), w.requires_grad_(), (b.requires_grad_() if bias else None), t


def token_logps(h, w, b, t, temperature=1.0, softcap=None, scale=1.0):
    """fp64 per-token log-probs [B, T] (0 where ignored) from the materialised logits."""
    z = h.double() @ w.double().T
    if b is not None:
        z = z + b.double()
    z = z * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = torch.log_softmax(z / temperature, -1)
    mask = t != IGNORE
    return logp.gather(-1, t.clamp(min=0)[..., None])[..., 0] * mask, mask


def halves(x):
    n = x.shape[0] // 2
    return x[:n], x[n:]


def dpo(h, w, b, t, ref_logps, beta, label_smoothing=0.0):
    lp, _ = token_logps(h, w, b, t)
    c, r = halves(lp.sum(-1) - ref_logps.double())
    z = beta * (c - r)
    return (-(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)).mean()


def _avg(lp, mask):
    return lp.sum(-1) / mask.sum(-1)


def _chosen_nll(h, w, b, t):
    n = h.shape[0] // 2
    z = h[:n].double() @ w.double().T + (0 if b is None else b.double())
    return F.cross_entropy(z.reshape(-1, z.shape[-1]), t[:n].reshape(-1), ignore_index=IGNORE)


def orpo(h, w, b, t, beta):
    lp, mask = token_logps(h, w, b, t)
    c, r = halves(_avg(lp, mask))
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    return _chosen_nll(h, w, b, t) - beta * F.logsigmoid(log_odds).mean()


def simpo(h, w, b, t, beta, gamma, label_smoothing=0.0, nll_weight=0.0):
    lp, mask = token_logps(h, w, b, t)
    c, r = halves(_avg(lp, mask))
    z = beta * (c - r - gamma / beta)
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return losses.mean() + nll_weight * _chosen_nll(h, w, b, t)


def kto(h, w, b, t, desirable, ref_logps, beta, kl, wd, wu):
    lp, _ = token_logps(h, w, b, t)
    lr = lp.sum(-1) - ref_logps.double()
    chosen = wd * (1 - torch.sigmoid(beta * (lr[desirable] - kl)))
    rejected = wu * (1 - torch.sigmoid(beta * (kl - lr[~desirable])))
    return torch.cat([chosen, rejected]).mean()


def grpo(h, w, b, t, adv, old, ref, beta, eps_low, eps_high, loss_type, temperature=1.0, delta=None):
    lp, mask = token_logps(h, w, b, t, temperature=temperature)
    coef_1 = torch.exp(lp - old.double())
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    adv = adv.double()[:, None] if adv.dim() == 1 else adv.double()
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    if beta:
        ref = ref.double()
        per_token = per_token + beta * (torch.exp(ref - lp) - (ref - lp) - 1)
    m = mask.double()
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1)).mean()
    if loss_type == "bnpo":
        return (per_token * m).sum() / m.sum()
    if loss_type == "dr_grpo":
        return (per_token * m).sum() / (m.shape[0] * m.shape[1])
    return (per_token * m).sum() / m.sum()


def divergence(s_logits, t_logits, beta, temperature):
    """TRL's generalized JSD per row: beta 0 forward KL(teacher || student), 1 reverse KL."""
    x = torch.log_softmax(s_logits.double() / temperature, -1)
    y = torch.log_softmax(t_logits.double() / temperature, -1)
    if beta == 0:
        return (y.exp() * (y - x)).sum(-1)
    if beta == 1:
        return (x.exp() * (x - y)).sum(-1)
    m = torch.log(beta * y.exp() + (1 - beta) * x.exp())
    return beta * (y.exp() * (y - m)).sum(-1) + (1 - beta) * (x.exp() * (x - m)).sum(-1)


def grads(loss, tensors):
    """Gradients of loss w.r.t. the tensors that require them (None for the others)."""
    wanted = [x for x in tensors if x is not None and x.requires_grad]
    got = iter(torch.autograd.grad(loss, wanted))
    return [next(got) if x is not None and x.requires_grad else None for x in tensors]


def assert_parity(fused, reference, tensors, rtol=1e-5, atol=1e-6):
    """Loss and gradients of fused (fp32) against reference (fp64), tight."""
    torch.testing.assert_close(fused.double(), reference, rtol=rtol, atol=atol)
    for got, want in zip(grads(fused, tensors), grads(reference, tensors), strict=True):
        if want is None:
            assert got is None
            continue
        assert want.abs().max() > 0  # the reference gradient is not trivially zero
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)
