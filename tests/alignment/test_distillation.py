"""Distillation through two fused heads against the divergences on full logits (TRL's generalized JSD)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from alignment_refs import IGNORE, assert_parity, batch, divergence

from liger_registry.alignment import distillation_loss


def _heads():
    sh, sw, _, t = batch(rows=3, seq=8, hidden=16, vocab=64, bias=False)
    th, tw, _, _ = batch(rows=3, seq=8, hidden=24, vocab=64, seed=3, bias=False)
    return sh, sw, th, tw, t


@pytest.mark.parametrize(
    ("divergence_name", "beta"), [("forward_kl", 0.0), ("reverse_kl", 1.0), ("jsd", 0.3)]
)
def test_soft_loss_and_student_gradients_match_the_divergence(divergence_name, beta):
    sh, sw, th, tw, t = _heads()
    out = distillation_loss(sh, sw, th, tw, t, divergence=divergence_name, beta=beta, temperature=2.0)
    rows = divergence(sh.double() @ sw.double().T, th.double() @ tw.double().T, beta, 2.0)
    assert_parity(out.loss, rows[t != IGNORE].mean(), [sh, sw])


def test_hard_and_soft_mix_and_the_teacher_gets_no_gradient():
    sh, sw, th, tw, t = _heads()
    out = distillation_loss(sh, sw, th, tw, t, soft_weight=0.4, hard_weight=0.6, chunk_mem_const=4)
    s_logits = sh.double() @ sw.double().T
    soft = divergence(s_logits, th.double() @ tw.double().T, 0.5, 1.0)[t != IGNORE].mean()
    hard = F.cross_entropy(s_logits.reshape(-1, 64), t.reshape(-1), ignore_index=IGNORE)
    assert_parity(out.loss, 0.4 * soft + 0.6 * hard, [sh, sw])
    distillation_loss(sh, sw, th, tw, t, hard_weight=1.0).loss.backward()
    assert th.grad is None and tw.grad is None


def test_without_targets_every_token_counts():
    sh, sw, th, tw, _ = _heads()
    out = distillation_loss(sh, sw, th, tw, divergence="forward_kl")
    rows = divergence(sh.double() @ sw.double().T, th.double() @ tw.double().T, 0.0, 1.0)
    torch.testing.assert_close(out.loss.double(), rows.mean(), rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused():
    sh, sw, th, tw, t = _heads()
    with pytest.raises(ValueError, match="divergence"):
        distillation_loss(sh, sw, th, tw, t, divergence="kl")
    with pytest.raises(ValueError, match="needs the target"):
        distillation_loss(sh, sw, th, tw, hard_weight=1.0)
