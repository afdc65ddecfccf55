"""GRPO through the fused head against TRL's GRPO formula on full logits."""

from __future__ import annotations

import pytest
import torch
from alignment_refs import assert_parity, batch, grpo, token_logps

from liger_registry.alignment import GRPO_LOSS_TYPES, grpo_loss


def _old_and_ref(h, w, b, t, seed=4):
    g = torch.Generator().manual_seed(seed)
    lp, _ = token_logps(h, w, b, t)
    old = (lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)).float().detach()
    ref = (lp + 0.2 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)).float().detach()
    return old, ref


@pytest.mark.parametrize("loss_type", GRPO_LOSS_TYPES)
def test_loss_and_gradients_match_the_formula(loss_type):
    h, w, b, t = batch(rows=6)
    adv = torch.randn(6, generator=torch.Generator().manual_seed(1))
    old, ref = _old_and_ref(h, w, b, t)
    out = grpo_loss(
        h, w, t, adv, b, old_logps=old, ref_logps=ref, beta=0.05, epsilon_high=0.28, loss_type=loss_type
    )
    want = grpo(h, w, b, t, adv, old, ref, 0.05, 0.2, 0.28, loss_type)
    assert_parity(out.loss, want, [h, w, b])
    assert 0 < out.metrics["clip_ratio/region_mean"] < 1  # the clipped branch is exercised


def test_per_token_advantages_temperature_delta_and_a_reference_head():
    h, w, b, t = batch(rows=4)
    rh, rw, rb, _ = batch(rows=4, seed=7)
    adv = torch.randn(t.shape, generator=torch.Generator().manual_seed(2))
    old, _ = _old_and_ref(h, w, b, t)
    ref = token_logps(rh, rw, rb, t, temperature=0.8)[0].float()
    out = grpo_loss(
        h, w, t, adv, b, old_logps=old, ref_hidden=rh, ref_weight=rw, ref_bias=rb, beta=0.1,
        delta=1.1, loss_type="grpo", temperature=0.8,
    )  # fmt: skip
    want = grpo(h, w, b, t, adv, old, ref, 0.1, 0.2, 0.2, "grpo", temperature=0.8, delta=1.1)
    assert_parity(out.loss, want, [h, w, b])


def test_on_policy_the_gradient_is_the_advantage_weighted_log_prob_gradient():
    h, w, b, t = batch(rows=4)
    adv = torch.tensor([1.0, -0.5, 0.25, 2.0])
    out = grpo_loss(h, w, t, adv, b, loss_type="bnpo")
    lp, mask = token_logps(h, w, b, t)
    surrogate = -(adv.double()[:, None] * lp).sum() / mask.sum()
    assert_parity(out.loss - out.loss.detach() + surrogate.detach(), surrogate, [h, w, b])


def test_bad_input_is_refused():
    h, w, b, t = batch(rows=4)
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(h, w, t, torch.zeros(4), b, loss_type="ppo")
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(h, w, t, torch.zeros(3), b)
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(h, w, t, torch.zeros(4), b, beta=0.1)
