"""Per-token log-probs with entropies through the chunked head against the materialised logits (fp64)."""

from __future__ import annotations

import pytest
import torch
from alignment_refs import IGNORE, assert_parity, batch, token_logps

from liger_registry.alignment import token_log_probs, token_log_probs_and_entropy


def _entropy(h, w, b, t, temperature=1.0, softcap=None, scale=1.0):
    z = (h.double() @ w.double().T + (0 if b is None else b.double())) * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    logp = torch.log_softmax(z / temperature, -1)
    return -(logp.exp() * logp).sum(-1) * (t != IGNORE)


HEADS = {
    "plain": dict(),
    "temperature, no bias": dict(temperature=0.7, bias=False),
    "softcap and scale": dict(softcap=3.0, scale=1.3, temperature=0.9),
}


@pytest.mark.parametrize("head", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("max_chunk_mib", [None, 0.001])  # one chunk; chunks of 4 tokens
def test_log_probs_and_entropies_match_the_logits(head, max_chunk_mib):
    head = dict(head)
    h, w, b, t = batch(rows=4, bias=head.pop("bias", True))
    scale = head.pop("scale", 1.0)
    options = dict(head, logit_scale=scale, max_chunk_mib=max_chunk_mib)
    logps, entropy = token_log_probs_and_entropy(h, w, t, b, **options)
    want_lp, mask = token_logps(h, w, b, t, head.get("temperature", 1.0), head.get("softcap"), scale)
    want_h = _entropy(h, w, b, t, head.get("temperature", 1.0), head.get("softcap"), scale)
    assert torch.equal(logps.mask, mask)
    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(t.shape, generator=g, dtype=torch.float64), torch.randn(t.shape, generator=g)
    fused = (logps.values * a).sum() + (entropy * c).sum()
    assert_parity(fused, (want_lp * a).sum() + (want_h * c.double()).sum(), [h, w, b])


def test_either_output_alone_carries_its_gradient():
    h, w, b, t = batch(rows=3)
    logps, entropy = token_log_probs_and_entropy(h, w, t, b, max_chunk_mib=0.001)
    assert_parity(entropy.sum(), _entropy(h, w, b, t).sum(), [h, w, b])
    logps, _ = token_log_probs_and_entropy(h, w, t, b)
    assert_parity(logps.values.sum(), token_log_probs(h, w, t, b).values.double().sum(), [h, w, b])


def test_a_batch_without_counted_tokens_gives_zeros_and_a_zero_gradient():
    h, w, b, t = batch(rows=2)
    logps, entropy = token_log_probs_and_entropy(h, w, torch.full_like(t, IGNORE), b)
    assert not logps.values.any() and not entropy.any()
    (logps.values.sum() + entropy.sum()).backward()
    assert not h.grad.any() and not w.grad.any()
