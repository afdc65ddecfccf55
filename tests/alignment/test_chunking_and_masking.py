"""Every alignment loss: the same loss and gradients whatever the chunk budget, and ignored tokens (prompt,
padding) change nothing and get no gradient."""

from __future__ import annotations

import pytest
import torch
from alignment_refs import IGNORE, batch

from liger_registry.alignment import dpo_loss, grpo_loss, kto_loss, orpo_loss, simpo_loss

REF = torch.linspace(-14, -10, 6)
LOSSES = {
    "dpo": lambda h, w, t, b, **k: dpo_loss(h, w, t, b, beta=0.2, ref_logps=REF, **k),
    "orpo": lambda h, w, t, b, **k: orpo_loss(h, w, t, b, **k),
    "simpo": lambda h, w, t, b, **k: simpo_loss(h, w, t, b, nll_weight=0.5, **k),
    "kto": lambda h, w, t, b, **k: kto_loss(
        h, w, t, torch.tensor([True, False, True, False, False, True]), b, ref_logps=REF, kl=0.1, **k
    ),
    "grpo": lambda h, w, t, b, **k: grpo_loss(
        h, w, t, torch.linspace(-1, 1, 6), b, old_logps=torch.full(t.shape, -4.0), loss_type="grpo", **k
    ),
}
BUDGETS = [{"chunk_mem_const": 1}, {"chunk_mem_const": 64}, {"max_chunk_mib": 8 * 256 * 4 / 2**20}]


def _run(name, h, w, t, b, **knobs):
    loss = LOSSES[name](h, w, t, b, **knobs).loss
    return (loss, *torch.autograd.grad(loss, [h, w, b]))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_chunk_budget_changes_nothing(name):
    h, w, b, t = batch(rows=6, seq=12, hidden=8, vocab=256)
    results = [_run(name, h, w, t, b, **knobs) for knobs in BUDGETS]
    for other in results[1:]:
        for x, y in zip(results[0], other, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_ignored_tokens_change_nothing_and_get_no_gradient(name):
    h, w, b, t = batch(rows=6, seq=12, hidden=8, vocab=256)
    ignored = t == IGNORE
    loss, dh, *_ = _run(name, h, w, t, b)
    assert (dh[ignored] == 0).all() and (dh[~ignored] != 0).any()
    noisy = (h + 5 * torch.randn(h.shape) * ignored[..., None]).detach().requires_grad_()
    other = torch.where(ignored, -7, t)
    again, *_ = _run(name, noisy, w, other, b, ignore_index=-7)
    torch.testing.assert_close(again, loss)
