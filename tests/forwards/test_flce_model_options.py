"""Model-level FLCE options (z-loss, label smoothing, fp32 dW accumulation, token scaling) set through apply
overrides, policies and liger_kernel_config-style dicts: the patched loss and gradients against a plain PyTorch
formula on the unpatched model's logits (CPU fp32)."""

import pytest
import torch
import torch.nn.functional as F

import liger_registry
from liger_registry.integrations import overrides_from_liger_kernel_config
from liger_registry.testing import tiny_batch, tiny_model

OPTIONS = {
    "lse_square_scale": 1e-3,
    "label_smoothing": 0.1,
    "use_token_scaling": True,
    "accum_dtype": "float32",
}


def formula_loss(model, batch, *, lse_square_scale=0.0, label_smoothing=0.0, use_token_scaling=False, **_):
    """Plain PyTorch: next-token CE with label smoothing, plus z-loss, times the detached p_y, mean over tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logits = logits[:, :-1].reshape(-1, logits.shape[-1])
    target = batch["labels"][:, 1:].reshape(-1)
    ce = F.cross_entropy(logits, target, reduction="none", label_smoothing=label_smoothing)
    lse = torch.logsumexp(logits, -1)
    rows = ce + lse_square_scale * lse * lse
    if use_token_scaling:
        rows = rows * torch.softmax(logits, -1).gather(1, target[:, None]).squeeze(1).detach()
    return rows.mean()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check(patched, reference, options, batch, skip_logits=None):
    patched.train()
    reference.train()
    out = patched(**batch, skip_logits=skip_logits)
    assert (out.logits is None) == (skip_logits is not False)
    ref = formula_loss(reference, batch, **options)
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    out.loss.backward()
    ref.backward()
    got, exp = _grads(patched), _grads(reference)
    assert got.keys() == exp.keys()
    for name in exp:
        torch.testing.assert_close(got[name], exp[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "options,skip_logits",
    [
        (OPTIONS, None),
        (OPTIONS, False),
        ({"lse_square_scale": 1e-2}, None),
        ({"label_smoothing": 0.2}, None),
        ({"use_token_scaling": True}, None),
    ],
    ids=["all-fused", "all-logits", "z_loss", "smoothing", "token_scaling"],
)
def test_apply_overrides_match_the_formula(options, skip_logits):
    reference, model = tiny_model("llama"), tiny_model("llama")
    liger_registry.apply(model, **options)
    _check(model, reference, options, tiny_batch(model, seq=12), skip_logits)


def test_defaults_leave_the_loss_as_the_models_own():
    reference, model = tiny_model("llama"), tiny_model("llama")
    liger_registry.apply(model)
    batch = tiny_batch(model, seq=12)
    _check(model, reference, {}, batch)


def test_policy_file_sets_the_options(tmp_path):
    policy = tmp_path / "zloss.yaml"
    policy.write_text(
        "policy: zloss\napplies_to: [llama]\nreason: r\n"
        "flce: {lse_square_scale: 0.001, label_smoothing: 0.1, use_token_scaling: true, accum_dtype: float32}\n"
    )
    reference, model = tiny_model("llama"), tiny_model("llama")
    handle = liger_registry.apply(model, policy=str(policy))
    assert "lse_square_scale=0.001, label_smoothing=0.1, accum_dtype=float32, use_token_scaling=True" in (
        handle.report.loss_line()
    )
    explanation = liger_registry.explain("llama", policy=str(policy))
    assert explanation.source("flce.use_token_scaling").name == "zloss"
    _check(model, reference, OPTIONS, tiny_batch(model, seq=12))


def test_liger_kernel_config_style_dict_sets_the_options():
    overrides = overrides_from_liger_kernel_config(
        {"use_token_scaling": True, "label_smoothing": 0.1}, "llama"
    )
    assert overrides == {"use_token_scaling": True, "label_smoothing": 0.1}
    reference, model = tiny_model("llama"), tiny_model("llama")
    liger_registry.apply(model, **overrides)
    _check(model, reference, {"use_token_scaling": True, "label_smoothing": 0.1}, tiny_batch(model, seq=12))


def test_fp32_accumulation_reaches_the_kernel():
    model = tiny_model("llama")
    handle = liger_registry.apply(model, accum_dtype="float32")
    assert model.forward.__liger_context__.flce_options.accum_dtype is torch.float32
    handle.revert()


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"label_smoothing": 1.5}, "label_smoothing"),
        ({"lse_square_scale": -1.0}, "lse_square_scale"),
        ({"accum_dtype": "float16"}, "accum_dtype"),
        ({"use_token_scaling": "yes"}, "use_token_scaling"),
    ],
)
def test_bad_values_are_registry_errors_and_change_nothing(bad, match):
    model = tiny_model("llama")
    forward = model.forward
    with pytest.raises(liger_registry.RegistryError, match=match):
        liger_registry.apply(model, **bad)
    assert liger_registry.patch_handle(model) is None and model.forward == forward


def test_bad_value_in_a_policy_file_names_the_file(tmp_path):
    policy = tmp_path / "bad.yaml"
    policy.write_text("policy: bad\napplies_to: [llama]\nreason: r\nflce: {accum_dtype: float16}\n")
    with pytest.raises(liger_registry.RegistryError, match="bad.yaml") as info:
        liger_registry.apply(tiny_model("llama"), policy=str(policy))
    assert "accum_dtype" in str(info.value)
