"""ORPO through the fused head against TRL's odds-ratio formula on full logits."""

from __future__ import annotations

import torch
from alignment_refs import assert_parity, batch, orpo, token_logps

from liger_registry.alignment import orpo_loss
from liger_registry.alignment.orpo import log1mexp


def test_loss_and_gradients_match_the_formula():
    h, w, b, t = batch()
    out = orpo_loss(h, w, t, b, beta=0.25)
    assert_parity(out.loss, orpo(h, w, b, t, 0.25), [h, w, b])


def test_the_nll_metric_is_the_chosen_cross_entropy():
    h, w, b, t = batch()
    out = orpo_loss(h, w, t, b)
    lp, mask = token_logps(h, w, b, t)
    torch.testing.assert_close(out.metrics["nll_loss"].double(), -lp[:2].sum() / mask[:2].sum())


def test_log1mexp_is_stable_on_both_sides_and_finite_at_zero():
    x = torch.tensor([-1e-6, -0.5, -0.7, -20.0], dtype=torch.float64)
    torch.testing.assert_close(log1mexp(x), torch.log(1 - torch.exp(x)))
    assert torch.isfinite(log1mexp(torch.zeros(1))).all()
