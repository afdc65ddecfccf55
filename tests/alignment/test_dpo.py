"""DPO through the fused head against TRL's sigmoid DPO formula on full logits."""

from __future__ import annotations

import pytest
import torch
from alignment_refs import assert_parity, batch, dpo, token_logps

from liger_registry.alignment import dpo_loss


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_loss_and_gradients_match_the_formula_with_given_reference_logps(label_smoothing):
    h, w, b, t = batch()
    ref = torch.randn(4, generator=torch.Generator().manual_seed(3)) - 12
    out = dpo_loss(h, w, t, b, beta=0.3, label_smoothing=label_smoothing, ref_logps=ref)
    assert_parity(out.loss, dpo(h, w, b, t, ref, 0.3, label_smoothing), [h, w, b])


def test_a_reference_head_gives_the_same_as_its_log_probs_and_gets_no_gradient():
    h, w, b, t = batch()
    rh, rw, rb, _ = batch(seed=5, hidden=24)
    ref = token_logps(rh, rw, rb, t)[0].sum(-1)
    out = dpo_loss(h, w, t, b, beta=0.1, ref_hidden=rh, ref_weight=rw, ref_bias=rb)
    assert_parity(out.loss, dpo(h, w, b, t, ref, 0.1), [h, w, b])
    dpo_loss(h, w, t, b, beta=0.1, ref_hidden=rh, ref_weight=rw, ref_bias=rb).loss.backward()
    assert rh.grad is None and rw.grad is None and rb.grad is None


def test_metrics_are_the_rewards_of_the_formula():
    h, w, b, t = batch()
    ref = torch.zeros(4)
    out = dpo_loss(h, w, t, None, beta=0.5, reference_free=True)
    logps = token_logps(h, w, None, t)[0].sum(-1)
    torch.testing.assert_close(out.metrics["rewards/chosen"].double(), 0.5 * logps[:2].mean())
    torch.testing.assert_close(out.metrics["rewards/margins"].double(), 0.5 * (logps[:2] - logps[2:]).mean())
    torch.testing.assert_close(out.loss, dpo_loss(h, w, t, beta=0.5, ref_logps=ref).loss)
    assert not any(m.requires_grad for m in out.metrics.values())


def test_bad_input_is_refused():
    h, w, b, t = batch()
    with pytest.raises(ValueError, match="needs a reference"):
        dpo_loss(h, w, t, b)
    with pytest.raises(ValueError, match="not both"):
        dpo_loss(h, w, t, b, ref_logps=torch.zeros(4), ref_hidden=h, ref_weight=w)
    with pytest.raises(ValueError, match=r"\[4\]"):
        dpo_loss(h, w, t, b, ref_logps=torch.zeros(2))
    with pytest.raises(ValueError, match="2B"):
        dpo_loss(h[:3], w, t[:3], b, reference_free=True)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(h, w, t, b, reference_free=True, label_smoothing=0.7)
    with pytest.raises(TypeError):
        dpo_loss(h, w, t, b, reference_free=True, chunk_size=4)
