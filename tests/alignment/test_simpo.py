"""SimPO through the fused head against TRL's CPO ``loss_type="simpo"`` formula on full logits."""

from __future__ import annotations

import pytest
from alignment_refs import assert_parity, batch, simpo

from liger_registry.alignment import simpo_loss


@pytest.mark.parametrize(("label_smoothing", "nll_weight"), [(0.0, 0.0), (0.1, 1.0)])
def test_loss_and_gradients_match_the_formula(label_smoothing, nll_weight):
    h, w, b, t = batch()
    out = simpo_loss(h, w, t, b, beta=2.0, gamma=0.8, label_smoothing=label_smoothing, nll_weight=nll_weight)
    assert_parity(out.loss, simpo(h, w, b, t, 2.0, 0.8, label_smoothing, nll_weight), [h, w, b])


def test_the_margin_moves_the_loss():
    h, w, b, t = batch()
    assert simpo_loss(h, w, t, b, gamma=2.0).loss > simpo_loss(h, w, t, b, gamma=0.0).loss
