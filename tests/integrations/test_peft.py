"""PEFT: LoRA on the decoder with patched kernels, lm_head in modules_to_save, LoRA on the lm_head, revert."""

from __future__ import annotations

import pytest
import torch
from integration_helpers import count_calls

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model

peft = pytest.importorskip("peft")

DECODER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(**config):
    config = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": DECODER, **config}
    return peft.get_peft_model(tiny_model("llama"), peft.LoraConfig(task_type="CAUSAL_LM", **config))


def train(model, steps: int = 3):
    """Per-step losses and the final gradients of the trainable parameters (plain SGD)."""
    batch = tiny_batch(model, batch=2, seq=16)
    batch["labels"][:, :3] = -100
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.5)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        optimizer.step()
    return losses, grads


def assert_same(a, b):
    (la, ga), (lb, gb) = a, b
    assert la == pytest.approx(lb, rel=1e-5)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-4, atol=1e-6, msg=name)


def test_lora_on_the_decoder_trains_like_unpatched_and_reverts():
    reference = train(peft_model())
    model = peft_model()
    handle = L.apply(model)  # finds the transformers model inside the PeftModel
    inner = model.get_base_model()
    assert L.patch_handle(model) is handle and {r.kernel for r in handle.report.patched} >= {
        "rms_norm",
        "swiglu",
        "rope",
        "forward",
    }
    with count_calls(inner.lm_head) as calls:
        assert_same(train(model), reference)
    assert calls == []
    assert L.revert(model)
    assert "forward" not in vars(inner) and L.patch_handle(inner) is None


def test_lm_head_in_modules_to_save_is_fused():
    reference = train(peft_model(modules_to_save=["lm_head"]))
    model = peft_model(modules_to_save=["lm_head"])
    wrapper = model.get_base_model().lm_head
    copy = wrapper.modules_to_save["default"]
    with L.patched(model), count_calls(copy) as calls:
        result = train(model)
    assert calls == [], "FLCE must read the trained copy of the head, not call it"
    assert_same(result, reference)
    assert any("modules_to_save" in n and "lm_head" in n for n in result[1])
    assert wrapper.original_module.weight.grad is None


def test_lora_adapted_lm_head_is_fused_into_the_weight():
    targets = [*DECODER, "lm_head"]
    reference = train(peft_model(target_modules=targets))
    model = peft_model(target_modules=targets)
    head = model.get_base_model().lm_head
    with L.patched(model), count_calls(head.base_layer) as calls:
        result = train(model)
    assert calls == []
    assert_same(result, reference)
    assert any("lm_head.lora_B" in n for n in result[1])


def test_lora_lm_head_with_dropout_falls_back_to_logits_with_a_warning():
    model = peft_model(target_modules=[*DECODER, "lm_head"], lora_dropout=0.1)
    batch = tiny_batch(model)
    with L.patched(model), count_calls(model.get_base_model().lm_head) as calls:
        model.train()
        with pytest.warns(
            UserWarning, match="peft.tuners.lora.layer.Linear.*falls back to materialised logits"
        ):
            out = model(**batch)
    assert calls == [1] and torch.isfinite(out.loss)
    assert out.logits is not None  # nothing fused: the logits it computed come back, as unpatched


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss"])
def test_lora_on_the_stacked_experts_weights_runs_the_experts_kernel(model_type, monkeypatch):
    """PEFT's LoRA on 3-D expert parameters (`target_parameters`: a parametrization, so the module's weight
    attribute reads W + BA): the experts kernel takes the adapted weights, the LoRA factors get the unpatched
    model's gradients."""

    def lora_experts():
        config = peft.LoraConfig(
            task_type="CAUSAL_LM",
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj"],
            target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        )
        return peft.get_peft_model(tiny_model(model_type), config)

    from liger_registry.modules import moe

    reference = train(lora_experts())
    model = lora_experts()
    handle = L.apply(model)
    assert "moe_experts" in {r.kernel for r in handle.report.patched}
    calls = []
    real = moe.moe_experts
    monkeypatch.setattr(moe, "moe_experts", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got = train(model)
    assert calls, "the experts kernel did not run under PEFT's parametrization"
    assert any("experts" in name and "lora" in name for name in got[1])
    assert_same(got, reference)
