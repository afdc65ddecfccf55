"""The scaffold end to end: drafts that match the hand-written entries, proofs, corrections and refusals."""

import importlib

import pytest
import yaml

from liger_registry import cli
from liger_registry.registry import load_registry
from liger_registry.registry.yaml_source import load_model
from liger_registry.scaffold import draft, entry_yaml, scaffold
from liger_registry.scaffold.decide import Verdict
from liger_registry.scaffold.report import format_report, reason_group, scaffold_all
from liger_registry.schemas import FamilyEntry

BUNDLED = load_registry()
draft_module = importlib.import_module("liger_registry.scaffold.draft")  # the package re-exports draft()


def _kernels(entry: FamilyEntry) -> dict:
    return {
        k: (s.enabled, sorted(s.targets) if hasattr(s, "targets") else None) for k, s in entry.kernels if s
    }


@pytest.mark.parametrize("model_type", ["llama", "gemma", "granite"])
def test_draft_agrees_with_the_hand_written_entry(model_type):
    """The bundled entries were written by hand before the scaffold existed: the draft makes the same choices."""
    drafted = draft(model_type).entry
    hand = BUNDLED.family_for(model_type).entry
    assert _kernels(drafted) == _kernels(hand)
    assert drafted.forward == hand.forward
    if hand.kernels.rms_norm is not None:
        for field in ("casting_mode", "offset", "eps_attr"):
            assert getattr(drafted.kernels.rms_norm, field) == getattr(hand.kernels.rms_norm, field), field
    assert (drafted.head.logit_scale_attr, drafted.head.softcap_attr) == (
        hand.head.logit_scale_attr,
        hand.head.softcap_attr,
    )


def _variant_options(entry: FamilyEntry) -> dict:
    k = entry.kernels
    return {
        "rope": (k.rope.layout, k.rope.function) if k.rope else None,
        "glu": [(g.gate_up, g.down) for g in (k.swiglu, k.geglu) if g is not None],
        "layer_norm": k.layer_norm.offset if k.layer_norm else None,
    }


@pytest.mark.parametrize(
    "model_type", ["phi3", "glm4", "nemotron", "gpt_oss", "llama4_text", "jetmoe", "dbrx"]
)
def test_variant_drafts_agree_with_the_hand_written_issue_12_entries(model_type):
    """phi3 (partial rope, fused gate_up), glm4 (interleaved rope, fused gate_up), nemotron (partial rope,
    LayerNorm1P, relu²), gpt_oss (half-split rope, clamped experts gate), llama4 (complex rope, its MoE block's
    input_scaled routing), jetmoe (its MoE block's softmax_top_k routing, weights through dotted paths), dbrx (its
    experts' separate gate and up, down stored [in, out], batch-first output): the draft turns on the same kernels on
    the same targets with the same variant options as the entries written by hand."""
    drafted, hand = draft(model_type).entry, BUNDLED.family_for(model_type).entry
    assert _kernels(drafted) == _kernels(hand)
    assert drafted.kernels.moe_experts == hand.kernels.moe_experts
    drafted_options, hand_options = _variant_options(drafted), _variant_options(hand)
    if hand_options["rope"] and hand_options["rope"][0] == "half_split":
        # GPT-OSS's half-width table: the default rope reads cos[..., :head_dim // 2] (the reference library's
        # rule), which is the half-split rotation; the draft tries the default first
        drafted_options["rope"] = ("half_split", drafted_options["rope"][1])
    assert drafted_options == hand_options


@pytest.mark.parametrize(
    ("model_type", "layout"),
    [
        ("phi3", "partial"),
        ("glm4", "interleaved"),
        ("helium", "interleaved"),
        ("ernie4_5", "interleaved_fp32"),
    ],
)
def test_rope_and_fused_gate_up_variants_are_drafted_and_proven(model_type, layout):
    result = scaffold(model_type)
    assert result.ok and not result.corrections, (result.reasons, result.corrections)
    assert result.proof.ok and max(result.proof.parity.values().values()) < 1e-5
    rope = result.entry.kernels.rope
    assert rope.enabled and rope.layout == layout
    if model_type in ("phi3", "glm4"):
        swiglu = result.entry.kernels.swiglu
        assert swiglu.enabled and swiglu.gate_up == "gate_up_proj"
    assert f"layout: {layout}" in result.yaml()


def test_scaffold_proves_the_draft_and_emits_yaml_that_round_trips(tmp_path):
    result = scaffold("cohere")
    assert result.ok, result.reasons
    assert result.proof.ok and max(result.proof.parity.values().values()) < 1e-5
    assert result.entry.head.logit_multiplier_attr == "logit_scale"  # multiplies, does not divide
    path = tmp_path / "cohere.yaml"
    path.write_text(result.yaml())
    assert load_model(path, FamilyEntry) == result.entry
    assert "casting_mode: llama" not in result.yaml()  # defaults are left out


@pytest.mark.parametrize(
    ("model_type", "function", "layout"),
    [
        ("deepseek_v3", "apply_rotary_pos_emb_interleave", "deinterleave"),  # pairs written as halves
        ("deepseek_v2", "apply_rotary_emb", "complex_heads_first"),  # heads before the sequence
        ("gemma4_text", "apply_rotary_pos_emb", "one_tensor"),  # q and k rotated apart
    ],
)
def test_family_rotary_functions_are_drafted_with_their_layouts(model_type, function, layout):
    """The layouts added for these families are found by the scaffold and agree with the bundled entries."""
    rope = draft(model_type).entry.kernels.rope
    assert rope.enabled and (rope.function, rope.layout) == (function, layout)
    hand = BUNDLED.family_for(model_type).entry.kernels.rope
    assert (hand.function, hand.layout) == (function, layout)


def test_cohere_rope_is_drafted_as_interleaved_pairs_with_cos_repeated_per_pair():
    assert draft("cohere").entry.kernels.rope.layout == "interleaved_repeated"


def test_jetmoe_router_loss_names_are_drafted_from_what_its_forward_reads():
    """JetMoE's forward multiplies the aux loss by self.aux_loss_coef (config.aux_loss_coef): the draft names it
    for causal_lm_moe instead of refusing, as the bundled entry does."""
    entry = draft("jetmoe").entry
    assert entry.forward == "causal_lm_moe" and entry.head.moe.coefficient_attr == "aux_loss_coef"
    assert entry.head.moe == BUNDLED.family_for("jetmoe").entry.head.moe


def _skip_where_dbrx_router_loss_fails():
    """transformers 5.17's DbrxModel returns no router logits, so its own forward with labels and
    output_router_logits=True fails (``0 .to``): there is no router loss to prove the draft against."""
    import transformers

    from liger_registry.testing import tiny_batch, tiny_model

    model = tiny_model("dbrx")
    try:
        model(**tiny_batch(model), output_router_logits=True)
    except AttributeError as exc:
        pytest.skip(
            f"transformers {transformers.__version__}: DbrxForCausalLM's own router loss fails: {exc}"
        )


def test_dbrx_router_loss_names_are_drafted_as_paths_into_its_nested_config():
    """DBRX's causal LM sets self.num_experts = config.ffn_config.moe_num_experts (and top-k, coefficient): the
    top-level names the lint checks are not in its config, so the draft names the nested paths, as the bundled
    entry does, and the entry is proven."""
    _skip_where_dbrx_router_loss_fails()
    result = scaffold("dbrx")
    assert result.ok and not result.corrections, (result.reasons, result.corrections)
    moe = result.entry.head.moe
    assert moe.num_experts_attrs == ["ffn_config.moe_num_experts"]
    assert (moe.top_k_attr, moe.coefficient_attr) == ("ffn_config.moe_top_k", "ffn_config.moe_loss_weight")
    assert moe == BUNDLED.family_for("dbrx").entry.head.moe
    assert "rope_theta" not in result.entry.tiny_config["ffn_config"]  # only the attention sub-config gets it


def test_a_tower_needing_missing_packages_is_refused_naming_every_package(monkeypatch):
    """Gemma 3n's vision tower (TimmWrapperModel) needs PIL and timm: the refusal names both, not the first."""
    message = (
        "\nTimmWrapperModel requires the PIL library but it was not found in your environment. You can install "
        "it with pip:\n`pip install pillow`.\n\nTimmWrapperModel requires the timm library but it was not found "
        "in your environment. You can install it with pip:\n`pip install timm`.\n"
    )

    def missing(*args, **kwargs):
        raise ImportError(message)

    monkeypatch.setattr("liger_registry.testing.tiny_model", missing)
    monkeypatch.setattr("liger_registry.testing.tiny_config", missing)
    result = scaffold("qwen2")
    assert not result.ok
    assert "TimmWrapperModel" in result.reasons[0] and "needs PIL, timm, not installed" in result.reasons[0]


@pytest.mark.parametrize(
    ("model_type", "words"), [("no_such_type", "no config"), ("gpt-sw3", "reports model_type")]
)
def test_types_it_cannot_serve_are_refused(model_type, words):
    result = scaffold(model_type)
    assert not result.ok and words in result.reasons[0]


def test_a_wrong_decision_is_caught_by_the_proof_and_turned_off(monkeypatch):
    """GLM-4's rope decided (wrongly) as rotate_half: the parity fails, and the proof turns rope off."""

    def wrong_rope(source, run, run_low=None):
        return Verdict("rope", "apply_rotary_pos_emb")

    monkeypatch.setattr(draft_module, "rope_verdict", wrong_rope)
    result = scaffold("glm4")
    assert result.ok, result.reasons
    assert [c.split(":")[0] for c in result.corrections] == ["rope off"]
    assert not result.entry.kernels.rope.enabled and "proof failed" in result.entry.kernels.rope.reason


def test_cli_prints_writes_and_refuses(tmp_path, capsys):
    # a type no bundled family serves is written; one that a family serves is refused before it runs
    assert cli.main(["scaffold", "diffllama", "--write", str(tmp_path)]) == 0
    entry = load_model(tmp_path / "diffllama.yaml", FamilyEntry)
    assert entry.kernels.swiglu.enabled and entry.kernels.rope.enabled
    assert "proven" in capsys.readouterr().err
    assert cli.main(["scaffold", "qwen3", "--write", str(tmp_path)]) == 2
    assert "already served by family 'qwen3'" in capsys.readouterr().err
    assert not (tmp_path / "qwen3.yaml").exists()
    assert cli.main(["scaffold", "bert"]) == 1
    assert "refused" in capsys.readouterr().err
    assert cli.main(["scaffold"]) == 2


def test_report_counts_and_groups():
    results = scaffold_all(["qwen2", "bert", "gpt-sw3"])
    report = format_report(results, 1.0)
    assert "3 causal-LM model types, 1 drafted and proven" in report and "2 refused" in report
    assert "the output projection is not a direct attribute" in report
    assert reason_group("the tiny model's forward raised IndexError: list index 3 out of range") == (
        "the tiny model's forward raised IndexError"
    )


def test_emitted_yaml_of_the_bundled_entries_round_trips():
    for name in ("gemma", "falcon_h1", "mllama"):
        entry = BUNDLED.family(name).entry
        assert FamilyEntry.model_validate(yaml.safe_load(entry_yaml(entry))) == entry


def test_default_configs_that_hide_a_code_path_are_changed():
    """Defaults that leave a path unbuilt: Phi-3's full rotary (Phi-4-mini rotates 0.75), LFM2's attention-only
    layers (checkpoints interleave short convolutions) and Granite 4's all-Mamba hybrid."""
    assert draft("phi3").entry.tiny_config["rope_parameters"]["partial_rotary_factor"] == 0.5
    lfm2 = draft("lfm2").entry.tiny_config
    assert (lfm2["layer_types"], lfm2["full_attn_idxs"]) == (["conv", "full_attention"], [1])
    assert draft("granitemoehybrid").entry.tiny_config["layer_types"] == [
        "linear_attention",
        "full_attention",
    ]


def test_a_text_models_own_sub_configs_are_made_small():
    """DBRX keeps its MLP sizes in ffn_config (3584 wide by default) and clamps q/k/v by attn_config.clip_qkv,
    whose default None makes the forward raise: both are set so the tiny model is tiny and runs."""
    from transformers import AutoConfig

    tiny, _ = draft_module.tiny_overrides(AutoConfig.for_model("dbrx"))
    assert tiny["ffn_config"]["ffn_hidden_size"] == 64 and tiny["ffn_config"]["hidden_size"] == 32
    assert tiny["attn_config"]["clip_qkv"] == 8.0
    model = draft_module.build_tiny(
        draft_module._base_entry(draft_module.model_source("dbrx"), "dbrx", tiny, "causal_lm")
    )
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
