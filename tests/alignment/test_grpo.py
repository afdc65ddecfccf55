"""GRPO and the RL losses through the fused head against TRL's own GRPOTrainer loss on the same log-probs."""

from __future__ import annotations

import pytest
import torch
from alignment_refs import IGNORE, assert_parity, batch, token_logps

from liger_registry.alignment import GRPO_LOSS_TYPES, GrpoOptions, grpo_loss, vllm_importance_sampling_ratio

pytest.importorskip("trl")
from trl_grpo_ref import TRL_DEFAULTS, TrlSamplerRatio, trl_loss  # noqa: E402

LEVELS = ("token", "sequence")
VLLM_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _old_and_ref(h, w, b, t, seed=4, temperature=1.0):
    """Old and reference log-probs near the policy's: per-token noise plus a per-sequence shift (so that the
    sequence-level ratio leaves the clipping range too), 0 where masked as TRL's head leaves them."""
    g = torch.Generator().manual_seed(seed)
    lp, mask = token_logps(h, w, b, t, temperature=temperature)
    shift = 0.3 * torch.randn(lp.shape[0], 1, generator=g, dtype=lp.dtype)
    old = (lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype) + shift) * mask
    ref = (lp + 0.2 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)) * mask
    return old.float().detach(), ref.float().detach()


def _advantages(rows, seed=1):
    return torch.randn(rows, generator=torch.Generator().manual_seed(seed))


def _same(out, want, trl_metrics, tensors):
    """Loss and gradients as TRL's, and every metric both log."""
    assert_parity(out.loss, want, tensors)
    for name in set(out.metrics) & set(trl_metrics):
        assert out.metrics[name].item() == pytest.approx(trl_metrics[name], rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", GRPO_LOSS_TYPES)
def test_every_loss_type_and_importance_sampling_level_is_trls(loss_type, level):
    h, w, b, t = batch(rows=6)
    adv = _advantages(6)
    old, ref = _old_and_ref(h, w, b, t)
    options = dict(beta=0.05, epsilon_high=0.28, loss_type=loss_type, importance_sampling_level=level)
    out = grpo_loss(h, w, t, adv, b, old_logps=old, ref_logps=ref, **options)
    want, metrics = trl_loss(h, w, b, t, adv, old=old, ref=ref, max_completion_length=t.shape[1], **options)
    _same(out, want, metrics, [h, w, b])


OPTIONS = {
    "two-sided delta": dict(loss_type="grpo", delta=1.1),
    "kl without bias correction": dict(loss_type="dapo", beta=0.1, use_bias_correction_kl=False),
    "dr_grpo constant": dict(loss_type="dr_grpo", max_completion_length=20),
    "sapo temperatures": dict(loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=2.0),
    "vespo gamma": dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.0, vespo_k_neg=2.5),
    "cispo cap": dict(loss_type="cispo", epsilon_high=1.1),
    "off-policy mask": dict(loss_type="dapo", off_policy_mask_threshold=0.02),
    "sequence off-policy mask": dict(
        loss_type="grpo", importance_sampling_level="sequence", beta=0.1, off_policy_mask_threshold=0.02
    ),
}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_options_are_trls(options):
    h, w, b, t = batch(rows=6, seed=3)
    adv = _advantages(6, seed=5)
    old, ref = _old_and_ref(h, w, b, t)
    out = grpo_loss(h, w, t, adv, b, old_logps=old, ref_logps=ref, **options)
    trl_options = {"max_completion_length": t.shape[1], **options}
    want, metrics = trl_loss(h, w, b, t, adv, old=old, ref=ref, **trl_options)
    _same(out, want, metrics, [h, w, b])
    if "off_policy_mask_threshold" in options:  # the mask drops a sequence here
        options = {**options, "off_policy_mask_threshold": None}
        assert (
            grpo_loss(h, w, t, adv, b, old_logps=old, ref_logps=ref, **options).loss.item() != out.loss.item()
        )


# quantiles whose threshold falls between two of the batch's 26 entropies: at an exact order statistic TRL
# compares its fp32-rounded threshold with the fp64 reference entropies, a tie decided by rounding
ENTROPY = [
    ("dapo", "token", 0.3, 0.0),
    ("grpo", "sequence", 0.5, 0.01),
    ("cispo", "token", 1.0, 0.02),
    ("vespo", "token", 0.25, -0.01),
    ("luspo", "sequence", 0.05, 0.0),
    ("sapo", "token", 0.55, 0.05),
]


@pytest.mark.parametrize("loss_type, level, quantile, coef", ENTROPY)
def test_the_entropy_mask_and_bonus_are_trls(loss_type, level, quantile, coef):
    h, w, b, t = batch(rows=5, seed=2)
    adv = _advantages(5, seed=3)
    old, ref = _old_and_ref(h, w, b, t, temperature=0.9)
    options = dict(loss_type=loss_type, importance_sampling_level=level, beta=0.02,
                   top_entropy_quantile=quantile, entropy_coef=coef)  # fmt: skip
    out = grpo_loss(h, w, t, adv, b, old_logps=old, ref_logps=ref, temperature=0.9, max_chunk_mib=0.002,
                    **options)  # fmt: skip
    want, metrics = trl_loss(h, w, b, t, adv, old=old, ref=ref, temperature=0.9, **options)
    _same(out, want, metrics, [h, w, b])
    assert "entropy" in out.metrics


def test_the_entropy_mask_keeps_the_top_quantile_of_tokens():
    h, w, b, t = batch(rows=5, seed=2)
    adv = torch.ones(5)
    kept = {}
    for q in (0.0, 0.5, 1.0):  # policy term only, bnpo: the loss is -(kept tokens) / (all tokens)
        kept[q] = -grpo_loss(h, w, t, adv, b, loss_type="bnpo", top_entropy_quantile=q).loss.item()
    n = (t != IGNORE).sum().item()
    assert kept[0.0] == pytest.approx(1 / n) and kept[1.0] == pytest.approx(1.0)
    assert 0.45 <= kept[0.5] <= 0.55


@pytest.fixture(scope="module")
def sampler_ratio(tmp_path_factory):
    return TrlSamplerRatio(str(tmp_path_factory.mktemp("grpo")))


LENGTHS = (3, 5, 1, 2, 4, 5)
SAMPLER = [
    ("token_truncate", "vespo", "token", 0.5, 2.0),
    ("token_mask", "vespo", "token", 0.5, 2.0),
    ("token_mask", "dapo", "token", None, 1.5),
    ("sequence_truncate", "grpo", "sequence", 0.5, 2.0),
    ("sequence_mask", "cispo", "token", None, 3.0),
    ("sequence_mask", "sapo", "sequence", 0.5, None),
    ("token_truncate", "luspo", "sequence", None, 1.2),
]


def _sampled_batch():
    """Right-padded completions of LENGTHS tokens (as the trainer pads them), old log-probs near the policy's,
    the sampler's near those, one of them NaN (a token the sampler could not score)."""
    h, w, b, _ = batch(rows=len(LENGTHS), seq=max(LENGTHS), seed=6)
    g = torch.Generator().manual_seed(7)
    t = torch.randint(0, w.shape[0], (len(LENGTHS), max(LENGTHS)), generator=g)
    for i, n in enumerate(LENGTHS):
        t[i, n:] = IGNORE
    lp, mask = token_logps(h, w, b, t)
    old = ((lp + 0.2 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)) * mask).float().detach()
    sampling = (old + 0.4 * torch.randn(old.shape, generator=g)) * mask
    sampling[1, 2] = float("nan")
    return h, w, b, t, old, sampling


@pytest.mark.parametrize("mode, loss_type, level, lo, hi", SAMPLER)
def test_the_sampler_correction_is_trls(sampler_ratio, mode, loss_type, level, lo, hi):
    h, w, b, t, old, sampling = _sampled_batch()
    adv = _advantages(len(LENGTHS), seed=8)
    trl_ratio = sampler_ratio(LENGTHS, old, sampling, mode, lo, hi)
    ratio = vllm_importance_sampling_ratio(old, sampling, t != IGNORE, mode, lo, hi)
    torch.testing.assert_close(ratio, trl_ratio.float(), rtol=1e-6, atol=0)
    options = dict(loss_type=loss_type, importance_sampling_level=level, vllm_importance_sampling_mode=mode,
                   vllm_importance_sampling_clip_min=lo, vllm_importance_sampling_clip_max=hi,
                   off_policy_mask_threshold=0.05)  # fmt: skip
    out = grpo_loss(h, w, t, adv, b, old_logps=old, sampling_logps=sampling, **options)
    want, metrics = trl_loss(h, w, b, t, adv, old=old, sampling=sampling, is_ratio=trl_ratio, **options)
    _same(out, want, metrics, [h, w, b])


def test_a_given_sampler_ratio_is_used_as_is():
    h, w, b, t, old, sampling = _sampled_batch()
    adv = _advantages(len(LENGTHS), seed=8)
    ratio = vllm_importance_sampling_ratio(old, sampling, t != IGNORE, "token_truncate", 0.5, 2.0)
    given = grpo_loss(h, w, t, adv, b, old_logps=old, importance_sampling_ratio=ratio).loss
    computed = grpo_loss(
        h, w, t, adv, b, old_logps=old, sampling_logps=sampling, vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=2.0,
    ).loss  # fmt: skip
    off = grpo_loss(h, w, t, adv, b, old_logps=old, sampling_logps=sampling,
                    vllm_importance_sampling_correction=False).loss  # fmt: skip
    plain = grpo_loss(h, w, t, adv, b, old_logps=old).loss
    assert given.item() == computed.item() and off.item() == plain.item() != given.item()


def test_the_defaults_are_trls():
    names = {"epsilon_low": "epsilon"}  # max_completion_length: None is the batch's T (TRL's counts tokens)
    for field, value in vars(GrpoOptions()).items():
        if field != "max_completion_length":
            assert TRL_DEFAULTS[names.get(field, field)] == value, field


def test_a_reference_head_and_per_token_advantages_at_a_temperature():
    h, w, b, t = batch(rows=4)
    rh, rw, rb, _ = batch(rows=4, seed=7)
    adv = torch.randn(t.shape, generator=torch.Generator().manual_seed(2))
    old, _ = _old_and_ref(h, w, b, t, temperature=0.8)
    ref = token_logps(rh, rw, rb, t, temperature=0.8)[0].float()
    out = grpo_loss(
        h, w, t, adv, b, old_logps=old, ref_hidden=rh, ref_weight=rw, ref_bias=rb, beta=0.1,
        delta=1.1, loss_type="grpo", temperature=0.8,
    )  # fmt: skip
    want, metrics = trl_loss(h, w, b, t, adv, old=old, ref=ref, beta=0.1, delta=1.1, loss_type="grpo",
                             temperature=0.8)  # fmt: skip
    _same(out, want, metrics, [h, w, b])


def test_on_policy_the_gradient_is_the_advantage_weighted_log_prob_gradient():
    h, w, b, t = batch(rows=4)
    adv = torch.tensor([1.0, -0.5, 0.25, 2.0])
    out = grpo_loss(h, w, t, adv, b, loss_type="bnpo")
    lp, mask = token_logps(h, w, b, t)
    surrogate = -(adv.double()[:, None] * lp).sum() / mask.sum()
    assert_parity(out.loss - out.loss.detach() + surrogate.detach(), surrogate, [h, w, b])


def test_bad_input_is_refused():
    h, w, b, t = batch(rows=4)
    adv, logps = torch.zeros(4), torch.zeros(t.shape)
    bad = [
        (ValueError, "loss_type", dict(loss_type="ppo")),
        (ValueError, "importance_sampling_level", dict(importance_sampling_level="batch")),
        (ValueError, "reference", dict(beta=0.1)),
        (ValueError, "top_entropy_quantile", dict(top_entropy_quantile=1.5)),
        (ValueError, "clip_min", dict(vllm_importance_sampling_clip_min=4.0)),
        (ValueError, "not both", dict(sampling_logps=logps, importance_sampling_ratio=torch.ones(4, 1))),
        (ValueError, "token_", dict(loss_type="vespo", sampling_logps=logps)),
        (TypeError, "epsilon", dict(epsilon=0.2)),
    ]
    for error, match, kwargs in bad:
        with pytest.raises(error, match=match):
            grpo_loss(h, w, t, adv, b, **kwargs)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(h, w, t, torch.zeros(3), b)
