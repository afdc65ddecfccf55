"""GPU checks of the alignment losses (skipped without CUDA): bf16 operands through the Triton fused head
against the fp64 formulas on full logits of the same (bf16-rounded) values, and the memory the losses take.

Error per tensor: ||out - ref|| / ||ref||. Run on a CUDA machine:
    TRITON_INTERPRET=0 python -m pytest -q -s tests/alignment/test_gpu_alignment.py
"""

from __future__ import annotations

import pytest
import torch
from alignment_refs import IGNORE, divergence, dpo, grads, grpo, kto, orpo, simpo, token_logps

from liger_registry.alignment import distillation_loss, dpo_loss, grpo_loss, kto_loss, orpo_loss, simpo_loss

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOL = 2e-2  # bf16 operands, fp32 accumulation
ROWS, SEQ, HID, VOCAB = 4, 256, 512, 32000


def _batch(dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(ROWS, SEQ, HID, generator=g, device="cuda").to(dtype)
    w = (torch.randn(VOCAB, HID, generator=g, device="cuda") * HID**-0.5).to(dtype)
    b = (torch.randn(VOCAB, generator=g, device="cuda") * 0.1).to(dtype)
    t = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g, device="cuda")
    t[:, :64] = IGNORE
    t[1, -32:] = IGNORE
    return h.requires_grad_(), w.requires_grad_(), b.requires_grad_(), t


def _rel(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp(min=1e-30)).item()


def _check(fused, reference, tensors):
    assert _rel(fused, reference) < TOL
    for got, want in zip(grads(fused, tensors), grads(reference, tensors), strict=True):
        assert got.dtype == torch.bfloat16
        assert _rel(got, want) < TOL


def _ref(h, w, t, b):
    """Reference log-probs a few nats from the policy's, so no sigmoid saturates and every pair has gradient."""
    with torch.no_grad():
        logps = token_logps(h, w, b, t)[0].sum(-1).float()
    return logps + torch.tensor([1.0, -2.0, 0.5, 3.0], device="cuda")


GOOD = [True, False, True, False]
ADV = [1.0, -1.0, 0.5, -0.5]


def _kto(h, w, t, b):
    good = torch.tensor(GOOD, device="cuda")
    return kto_loss(h, w, t, good, b, ref_logps=_ref(h, w, t, b), kl=0.5).loss


def _kto_ref(h, w, t, b):
    return kto(h, w, b, t, torch.tensor(GOOD, device="cuda"), _ref(h, w, t, b), 0.1, 0.5, 1.0, 1.0)


def _old(t):
    return torch.full(t.shape, -10.0, device="cuda")


def _grpo(h, w, t, b):
    return grpo_loss(h, w, t, torch.tensor(ADV, device="cuda"), b, old_logps=_old(t), loss_type="grpo").loss


def _grpo_ref(h, w, t, b):
    return grpo(h, w, b, t, torch.tensor(ADV, device="cuda"), _old(t), None, 0.0, 0.2, 0.2, "grpo")


CASES = {
    "dpo": (
        lambda h, w, t, b: dpo_loss(h, w, t, b, beta=0.1, ref_logps=_ref(h, w, t, b)).loss,
        lambda h, w, t, b: dpo(h, w, b, t, _ref(h, w, t, b), 0.1),
    ),
    "orpo": (lambda h, w, t, b: orpo_loss(h, w, t, b).loss, lambda h, w, t, b: orpo(h, w, b, t, 0.1)),
    "simpo": (
        lambda h, w, t, b: simpo_loss(h, w, t, b, beta=2.0, gamma=0.5).loss,
        lambda h, w, t, b: simpo(h, w, b, t, 2.0, 0.5),
    ),
    "kto": (_kto, _kto_ref),
    "grpo": (_grpo, _grpo_ref),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bf16_loss_and_gradients_match_the_formula(name):
    fused, reference = CASES[name]
    h, w, b, t = _batch()
    _check(fused(h, w, t, b), reference(h, w, t, b), [h, w, b])


@pytest.mark.parametrize("divergence_name", ["forward_kl", "reverse_kl", "jsd"])
def test_bf16_distillation_matches_the_divergence(divergence_name):
    sh, sw, _, t = _batch()
    th, tw, _, _ = _batch(seed=1)
    beta = {"forward_kl": 0.0, "reverse_kl": 1.0, "jsd": 0.5}[divergence_name]
    out = distillation_loss(sh, sw, th, tw, t, divergence=divergence_name, temperature=2.0)
    rows = divergence(sh.double() @ sw.double().T, th.double() @ tw.double().T, beta, 2.0)
    _check(out.loss, rows[t != IGNORE].mean(), [sh, sw])


RL = {
    "dapo, entropy bonus": dict(loss_type="dapo", entropy_coef=0.05),
    "bnpo, entropy bonus, fp32 accumulation": dict(
        loss_type="bnpo", entropy_coef=0.05, accum_dtype=torch.float32
    ),
    "gspo, sampler correction": dict(loss_type="grpo", importance_sampling_level="sequence", sampler=True),
    "vespo, sampler correction": dict(
        loss_type="vespo", vllm_importance_sampling_mode="token_truncate", sampler=True
    ),
    "cispo, kl": dict(loss_type="cispo", epsilon_high=5.0, beta=0.04),
}


@pytest.mark.parametrize("options", RL.values(), ids=RL.keys())
def test_bf16_rl_losses_match_their_fp64_cpu_run(options):
    """The RL losses with bf16 operands on the GPU (Triton head, or the chunked entropy head) against the same
    loss on the CPU in fp64 from the same bf16-rounded values (the CPU loss is TRL's: tests/alignment/
    test_grpo.py). No entropy mask here: bf16 entropies move tokens across the quantile, which changes
    those tokens' gradients entirely (the mask is checked on the CPU)."""
    options = dict(options)
    h, w, b, t = _batch()
    adv = torch.tensor(ADV, device="cuda")
    with torch.no_grad():
        lp, mask = token_logps(h, w, b, t)
        old = ((lp + 0.1 * torch.randn_like(lp)) * mask).float()
    sampling = ((old + 0.1 * torch.randn_like(old)) * mask) if options.pop("sampler", False) else None
    fused = grpo_loss(h, w, t, adv, b, old_logps=old, ref_logps=old, sampling_logps=sampling, **options)
    cpu = [x.detach().cpu().double().requires_grad_() for x in (h, w, b)]
    given = [None if x is None else x.cpu() for x in (t, adv, old, sampling)]
    t_cpu, adv_cpu, old_cpu, sampling_cpu = given
    options.pop("accum_dtype", None)
    want = grpo_loss(*cpu[:2], t_cpu, adv_cpu, cpu[2], old_logps=old_cpu, ref_logps=old_cpu,
                     sampling_logps=sampling_cpu, **options)  # fmt: skip
    assert _rel(fused.loss.cpu(), want.loss) < TOL
    for got, ref in zip(grads(fused.loss, [h, w, b]), grads(want.loss, cpu), strict=True):
        assert got.dtype == torch.bfloat16
        assert _rel(got.cpu(), ref) < TOL


@pytest.mark.exclusive
def test_the_entropy_path_takes_a_fraction_of_the_logits_memory():
    h, w, b, t = _batch()
    logits_bytes = ROWS * SEQ * VOCAB * 4
    adv = torch.tensor(ADV, device="cuda")
    # an untimed call first: the first GEMM of a process allocates cuBLAS's workspace (32 MiB on Hopper), which
    # is no part of the loss's memory and would count here when this test is the process's first
    grpo_loss(h, w, t, adv, b, top_entropy_quantile=0.2, entropy_coef=0.01).loss.backward()
    for x in (h, w, b):
        x.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grpo_loss(h, w, t, adv, b, top_entropy_quantile=0.2, entropy_coef=0.01).loss.backward()
    torch.cuda.synchronize()
    grads_bytes = sum(x.grad.numel() * x.grad.element_size() for x in (h, w, b))
    fused_peak = torch.cuda.max_memory_allocated() - base - grads_bytes
    assert fused_peak < logits_bytes / 4, (fused_peak, logits_bytes)


@pytest.mark.exclusive
def test_the_losses_take_a_fraction_of_the_logits_memory():
    h, w, b, t = _batch()
    logits_bytes = ROWS * SEQ * VOCAB * 4
    ref_logps = _ref(h, w, t, b)  # the reference materialises full logits: outside the measured window
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    dpo_loss(h, w, t, b, ref_logps=ref_logps).loss.backward()
    torch.cuda.synchronize()
    grads_bytes = sum(x.grad.numel() * x.grad.element_size() for x in (h, w, b))
    fused_peak = torch.cuda.max_memory_allocated() - base - grads_bytes
    assert fused_peak < logits_bytes / 4, (fused_peak, logits_bytes)
