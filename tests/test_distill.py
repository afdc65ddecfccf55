"""The distillation helper: fused linear JSD between two models' heads, with the family's resolved JSD knob."""

import pytest
import torch

from liger_registry import distill, kernels
from liger_registry.testing import tiny_batch, tiny_model


def _jsd_rows(s_logits, t_logits, beta, temperature):
    x = torch.log_softmax(s_logits.double() / temperature, -1)
    y = torch.log_softmax(t_logits.double() / temperature, -1)
    q, p = x.exp(), y.exp()
    log_m = torch.log(beta * p + (1 - beta) * q)
    return beta * (p * (y - log_m)).sum(-1) + (1 - beta) * (q * (x - log_m)).sum(-1)


def test_jsd_loss_matches_the_logits_reference_and_trains_the_student_only():
    student, teacher = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    batch = tiny_batch(student)
    batch["labels"][:, :3] = -100
    loss = distill.jsd_loss(student, teacher, batch, jsd_beta=0.3, temperature=2.0)
    loss.backward()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s_logits, t_logits = student(**inputs).logits, teacher(**inputs).logits
    rows = _jsd_rows(
        s_logits.reshape(-1, s_logits.shape[-1]), t_logits.reshape(-1, t_logits.shape[-1]), 0.3, 2.0
    )
    target = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:].reshape(-1)
    expected = rows[target != -100].mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)
    assert student.lm_head.weight.grad is not None and teacher.lm_head.weight.grad is None


def test_the_resolved_jsd_knob_reaches_the_kernel(monkeypatch, tmp_path):
    seen = []
    real = kernels.fused_linear_jsd

    def spy(*args, **kwargs):
        seen.append(kwargs["chunk_mem_const"])
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "fused_linear_jsd", spy)
    student, teacher = tiny_model("llama"), tiny_model("llama", seed=1)
    batch = tiny_batch(student)
    distill.jsd_loss(student, teacher, batch)
    distill.jsd_loss(student, teacher, batch, jsd_chunk_mem_const=4)
    policy = tmp_path / "p.yaml"
    policy.write_text("policy: p\napplies_to: [llama]\nreason: r\nfused_linear_jsd: {chunk_mem_const: 2}\n")
    distill.jsd_loss(student, teacher, batch, policy=policy)
    assert seen == [1, 4, 2]


def test_a_family_without_head_is_refused():
    model = tiny_model("qwen2_vl_text")
    with pytest.raises(ValueError, match="no causal-LM head"):
        distill.jsd_loss(model, model, tiny_batch(model))


@pytest.mark.parametrize(
    "family,config",
    [
        ("granite", {"logits_scaling": 4.0}),
        ("cohere", {"logit_scale": 0.5}),
        ("gemma2", {"final_logit_softcapping": 3.0}),
    ],
)
def test_jsd_loss_applies_the_family_logit_transform(family, config):
    """The model's own logits (softcapped, scaled) are the reference, as the alignment losses' model_head."""
    student, teacher = tiny_model(family, seed=0, **config), tiny_model(family, seed=1, **config)
    batch = tiny_batch(student)
    loss = distill.jsd_loss(student, teacher, batch, jsd_beta=0.5, temperature=1.5)
    loss.backward()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s_logits, t_logits = student(**inputs).logits, teacher(**inputs).logits
    rows = _jsd_rows(
        s_logits.reshape(-1, s_logits.shape[-1]), t_logits.reshape(-1, t_logits.shape[-1]), 0.5, 1.5
    )
    target = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:].reshape(-1)
    torch.testing.assert_close(loss.double(), rows[target != -100].mean(), rtol=1e-5, atol=1e-6)
    assert student.lm_head.weight.grad is not None and teacher.lm_head.weight.grad is None
