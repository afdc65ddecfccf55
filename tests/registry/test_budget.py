"""The FLCE budget knobs on the registry side: max_chunk_mib and strategy, the one-budget-knob layering rule, the
opt-in throughput policy, FlceOptions built once per forward, explain --tokens."""

import dataclasses

import pytest
import torch

import liger_registry
from liger_registry import kernels
from liger_registry.integrations import overrides_from_liger_kernel_config
from liger_registry.registry.errors import RegistryError
from liger_registry.registry.loader import load_policy
from liger_registry.testing import tiny_batch, tiny_model


def knobs(explanation):
    return {
        k: (explanation.value(k), explanation.source(k).layer)
        for k in ("flce.chunk_mem_const", "flce.max_chunk_mib")
    }


def test_default_budget_is_c1_and_throughput_is_opt_in():
    assert knobs(liger_registry.explain("llama")) == {
        "flce.chunk_mem_const": (1, 1),
        "flce.max_chunk_mib": (None, 1),
    }
    assert liger_registry.explain("llama").config.policies == []
    assert liger_registry.explain("gpt_oss").value("flce.chunk_mem_const") == 8  # its bundled policy


@pytest.mark.parametrize("model_type", ["llama", "gpt_oss"])
def test_throughput_by_name_clears_chunk_mem_const(model_type):
    explanation = liger_registry.explain(model_type, policy="throughput")
    assert knobs(explanation) == {"flce.chunk_mem_const": (None, 4), "flce.max_chunk_mib": (512, 4)}
    assert str(explanation.source("flce.chunk_mem_const")) == "user policy throughput (throughput.yaml)"


def test_a_higher_layer_setting_one_knob_clears_the_other():
    explanation = liger_registry.explain("llama", policy="throughput", chunk_mem_const=8)
    assert knobs(explanation) == {"flce.chunk_mem_const": (8, 5), "flce.max_chunk_mib": (None, 5)}
    explanation = liger_registry.explain("gpt_oss", max_chunk_mib=64.5, flce_strategy="tokens")
    assert knobs(explanation) == {"flce.chunk_mem_const": (None, 5), "flce.max_chunk_mib": (64.5, 5)}
    assert (
        explanation.value("flce.strategy") == "tokens" and explanation.config.entry.flce.max_chunk_mib == 64.5
    )


def test_both_budget_knobs_in_one_layer_is_an_error_naming_the_layer(tmp_path):
    with pytest.raises(
        RegistryError, match="override: sets both flce.chunk_mem_const and flce.max_chunk_mib"
    ):
        liger_registry.explain("llama", chunk_mem_const=2, max_chunk_mib=100)
    policy = tmp_path / "both.yaml"
    policy.write_text(
        "policy: both\napplies_to: ['*']\nreason: r\nflce: {chunk_mem_const: 2, max_chunk_mib: 100}\n"
    )
    with pytest.raises(RegistryError, match=r"both.yaml:4: flce: .*one budget knob"):
        load_policy(policy)
    family = tmp_path / "fam.yaml"
    family.write_text(
        "family: fam\nmodel_types: [fam]\nmodule: transformers.models.llama.modeling_llama\ncausal_lm: LlamaForCausalLM\n"
        "flce: {chunk_mem_const: 2, max_chunk_mib: 100}\n"
    )
    with pytest.raises(RegistryError, match=r"fam.yaml:5: flce: .*one budget knob"):
        liger_registry.load_registry(tmp_path)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"max_chunk_mib": 0}, "max_chunk_mib"),
        ({"max_chunk_mib": True}, "max_chunk_mib"),
        ({"flce_strategy": "rows"}, "flce_strategy"),
    ],
)
def test_bad_budget_values_are_refused(overrides, match):
    with pytest.raises(RegistryError, match=match):
        liger_registry.explain("llama", **overrides)


def test_liger_kernel_config_style_knobs():
    config = {"rms_norm": False, "max_chunk_mib": 256, "flce_strategy": "vocab"}
    assert overrides_from_liger_kernel_config(config, "llama") == {
        "rms_norm": False,
        "add_rms_norm": False,  # the reference's rms_norm switch is every RMSNorm, the fused add + norm too
        "max_chunk_mib": 256,
        "flce_strategy": "vocab",
    }
    with pytest.raises(ValueError, match="max_chunk_mib"):
        overrides_from_liger_kernel_config({"max_chunk_mib": -1})
    with pytest.raises(ValueError, match="max_chunk_mb"):
        overrides_from_liger_kernel_config({"max_chunk_mb": 1})


def test_unknown_policy_name_is_an_error():
    with pytest.raises(
        RegistryError, match="no policy file or registry policy named 'thruput' .*did you mean 'throughput'"
    ):
        liger_registry.explain("llama", policy="thruput")


def _spy(monkeypatch):
    """Record the FlceOptions each call gets; run the call as given."""
    seen, real = [], kernels.fused_linear_cross_entropy

    def spy(hidden, weight, target, bias=None, *, options, **flags):
        seen.append(options)
        return real(hidden, weight, target, bias, options=options, **flags)

    monkeypatch.setattr(kernels, "fused_linear_cross_entropy", spy)
    return seen


def test_flce_options_built_once_per_forward_and_replaced_per_call(monkeypatch):
    seen = _spy(monkeypatch)
    reference, model = tiny_model("granite"), tiny_model("granite")
    batch = tiny_batch(model)
    model.train(), reference.train()
    with liger_registry.patched(model, policy="throughput", flce_strategy="tokens") as handle:
        built = model.forward.__liger_context__.flce_options
        assert (built.chunk_mem_const, built.max_chunk_mib, built.strategy) == (None, 512, "tokens")
        loss = model(**batch).loss
        model(**batch, num_items_in_batch=torch.tensor(7))
        assert "max_chunk_mib=512" in str(handle.report)
    torch.testing.assert_close(loss, reference(**batch).loss)
    first, second = seen
    assert dataclasses.replace(first, softcap=None, logit_scale=1.0, reduction="mean") == built
    assert first.logit_scale == pytest.approx(
        1 / model.config.logits_scaling
    )  # granite: from the model's config
    assert (first.reduction, second.reduction) == ("mean", "sum")


class FakePlan:
    strategy, chunk_tokens, chunk_vocab, num_chunks, buffer_mib, budget_mib = (
        "vocab",
        4096,
        8192,
        16,
        64.0,
        512.0,
    )
    why = "vocabulary chunks: no dW read-modify-write"
    scratch = False

    def __str__(self):
        return "vocab: 16 chunks of 4096 x 8192"


def test_explain_tokens_prints_the_plan_with_its_knobs(monkeypatch, capsys):
    calls = []

    def flce_plan(bt, h, v, **knobs):
        calls.append((bt, h, v, knobs))
        return FakePlan()

    monkeypatch.setattr(kernels, "flce_plan", flce_plan)
    from liger_registry import cli

    assert cli.main(["explain", "llama", "--tokens", "4096", "--policy", "throughput"]) == 0
    out = capsys.readouterr().out
    from transformers import LlamaConfig

    default = LlamaConfig()
    assert calls == [
        (
            4096,
            default.hidden_size,
            default.vocab_size,
            {"chunk_mem_const": None, "max_chunk_mib": 512, "strategy": "auto", "dtype": torch.bfloat16},
        )
    ]
    assert (
        "FLCE plan for 4096 tokens" in out
        and "vocab: 16 chunks of 4096 x 8192" in out
        and "budget 512.0 MiB" in out
    )
    assert "flce.max_chunk_mib = 512  (set by user policy throughput (throughput.yaml))" in out
    assert cli.main(["explain", "llama", "--tokens", "10", "--hidden", "64", "--vocab", "1000"]) == 0
    assert calls[-1][:3] == (10, 64, 1000) and calls[-1][3]["chunk_mem_const"] == 1


def test_explain_tokens_against_the_real_planner():
    explanation = liger_registry.explain("llama", tokens=4096, policy="throughput")
    plan = explanation.plan()
    assert plan.strategy in ("tokens", "vocab") and plan.buffer_mib <= plan.budget_mib <= 512 + 1e-6
    assert "FLCE plan for 4096 tokens" in str(explanation)


def test_explain_tokens_for_a_named_gpu(capsys):
    """From a CPU machine, the plan an H200 would run: Llama-3-8B's head at 4096 tokens keeps every vocabulary
    chunk (the layout the cost model chooses there, measured 0.92x the one-kept layout)."""
    from liger_registry import cli

    args = ["explain", "llama", "--tokens", "4096", "--hidden", "4096", "--vocab", "128256"]
    assert cli.main([*args, "--gpu", "NVIDIA H200"]) == 0
    out = capsys.readouterr().out
    assert "vocab: 33 + 33 chunks" in out and "0 recomputed" in out and "on H200" in out
    plan = liger_registry.explain("llama", tokens=4096, hidden=4096, vocab=128256, gpu="H200").plan()
    assert plan.device == "H200" and plan.recomputed == 0


def test_explain_tokens_with_a_bad_shape_is_a_clear_error(capsys):
    from liger_registry import cli

    assert cli.main(["explain", "llama", "--tokens", "-1"]) == 2  # a usage error of the flag, in its words
    assert "argument --tokens: must be at least 1, got -1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tokens must be a whole number of at least 1, got -1"):
        liger_registry.explain("llama", tokens=-1)
