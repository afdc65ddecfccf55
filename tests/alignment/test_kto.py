"""KTO through the fused head against TRL's KTO formula on full logits."""

from __future__ import annotations

import pytest
import torch
from alignment_refs import assert_parity, batch, kto, token_logps

from liger_registry.alignment import kto_loss, kto_reference_kl


@pytest.mark.parametrize("kl", [0.0, 0.4])
def test_loss_and_gradients_match_the_formula(kl):
    h, w, b, t = batch(rows=5)
    desirable = torch.tensor([True, False, True, True, False])
    ref = torch.randn(5, generator=torch.Generator().manual_seed(2)) - 12
    out = kto_loss(
        h, w, t, desirable, b, beta=0.2, kl=kl, ref_logps=ref, desirable_weight=1.3, undesirable_weight=0.7
    )
    assert_parity(out.loss, kto(h, w, b, t, desirable, ref, 0.2, kl, 1.3, 0.7), [h, w, b])


def test_a_reference_head_and_the_kl_point_from_mismatched_pairs():
    h, w, b, t = batch(rows=4)
    rh, rw, rb, _ = batch(rows=4, seed=9)
    desirable = torch.tensor([True, False, False, True])
    kl_t = t.roll(1, dims=0)  # mismatched completions
    with torch.no_grad():
        kl = kto_reference_kl(token_logps(h, w, b, kl_t)[0].sum(-1), token_logps(rh, rw, rb, kl_t)[0].sum(-1))
    ref = token_logps(rh, rw, rb, t)[0].sum(-1)
    out = kto_loss(h, w, t, desirable, b, kl=kl, ref_hidden=rh, ref_weight=rw, ref_bias=rb)
    assert_parity(out.loss, kto(h, w, b, t, desirable, ref, 0.1, kl, 1.0, 1.0), [h, w, b])
    assert out.metrics["kl"] == kl and kl >= 0


def test_bad_input_is_refused():
    h, w, b, t = batch(rows=4)
    with pytest.raises(ValueError, match="bool"):
        kto_loss(h, w, t, torch.ones(4), b, ref_logps=torch.zeros(4))
    with pytest.raises(ValueError, match="needs a reference"):
        kto_loss(h, w, t, torch.ones(4, dtype=torch.bool), b)
