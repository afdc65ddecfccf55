"""The lint proves skip_logits handling: it passes the bundled registry and fails bad forwards."""

import json
from pathlib import Path

import pytest

import liger_registry
from liger_registry import cli
from liger_registry.forwards import register_forward
from liger_registry.forwards import registry as forward_table
from liger_registry.forwards.causal_lm import _base_call, _output, causal_lm
from liger_registry.lint import lint, lint_forward
from liger_registry.registry.loader import LoadedFamily, Registry


def test_lint_forward_flags_kwargs_only_forward():
    def llama4_style(self, input_ids=None, labels=None, **kwargs):
        return None

    findings = lint_forward(llama4_style)
    assert [f.check for f in findings] == ["skip-logits"]


def test_lint_forward_flags_missing_original_parameters():
    def original(self, input_ids=None, cache=None, logits_to_keep=0, **kwargs):
        return None

    def narrow(self, input_ids=None, *, skip_logits=None):
        return None

    findings = lint_forward(narrow, original)
    assert {f.message.split("'")[1] for f in findings if f.check == "signature"} == {
        "cache",
        "logits_to_keep",
        "kwargs",
    }


def test_bundled_registry_is_clean(capsys):
    assert cli.main(["lint", "--deep"]) == 0
    assert "well-formed" in capsys.readouterr().out


def build_as(monkeypatch, name, real_type, **pinned):
    """Tiny models of the test family `name` are `real_type` configs reporting `name`, so apply() picks its
    entry; `pinned` config values hold whatever the bundled family's tiny_config says."""
    from liger_registry import testing

    real = testing.tiny_config

    def tagged(model_type, registry=None, **overrides):
        if model_type == name:
            overrides = {**overrides, **pinned}
        config = real(real_type if model_type == name else model_type, registry, **overrides)
        config.model_type = model_type
        return config

    monkeypatch.setattr(testing, "tiny_config", tagged)


def build_as_llama(monkeypatch, name):
    build_as(monkeypatch, name, "llama")


@pytest.fixture
def bad_family(tmp_path):
    """A family YAML that names a forward registered for the test, removed afterwards."""

    def make(name, fn):
        register_forward(name)(fn)
        (tmp_path / f"{name}.yaml").write_text(
            f"family: {name}\nmodel_types: [{name}]\nmodule: transformers.models.llama.modeling_llama\n"
            f"causal_lm: LlamaForCausalLM\nforward: {name}\n"
        )
        return str(tmp_path)

    yield make
    for name in ("no_skip", "ignores_skip", "drops_logits"):
        forward_table._FORWARDS.pop(name, None)


def test_lint_exits_1_on_a_forward_without_skip_logits(bad_family, capsys):
    def no_skip(self, ctx, *args, **kwargs):
        named, extra = ctx.bind(self, args, kwargs)
        return _output(ctx, _base_call(self, ctx, named, extra), named)

    directory = bad_family("no_skip", no_skip)
    assert cli.main(["lint", "--registry", directory, "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any(f["check"] == "skip-logits" and "no_skip" in f["where"] for f in report["findings"])


def test_lint_deep_exits_1_on_a_forward_that_ignores_skip_logits(bad_family, monkeypatch, capsys):
    def ignores_skip(self, ctx, *args, skip_logits=None, **kwargs):
        named, extra = ctx.bind(self, args, kwargs)
        outputs = _base_call(self, ctx, named, extra)
        logits = self.lm_head(outputs.last_hidden_state)
        labels = named.get("labels")
        loss = (
            None
            if labels is None
            else self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size)
        )
        return _output(ctx, outputs, named, loss=loss, logits=logits)

    directory = bad_family("ignores_skip", ignores_skip)
    build_as_llama(monkeypatch, "ignores_skip")
    assert (
        cli.main(["lint", "--registry", directory]) == 0
    )  # the signature is right: only running it shows the bug
    capsys.readouterr()
    assert cli.main(["lint", "--deep", "--registry", directory, "--family", "ignores_skip"]) == 1
    out = capsys.readouterr().out
    assert "ignores_skip.yaml (deep)" in out and "logits returned" in out


def test_lint_deep_flags_a_forward_that_drops_the_logits_it_did_not_fuse(bad_family, monkeypatch, capsys):
    """With FLCE off, skip_logits=None in training must return the logits (as unpatched): a forward that skips
    them anyway is right with FLCE on and wrong with it off, which the proof runs too."""

    def drops_logits(self, ctx, *args, skip_logits=None, **kwargs):
        if skip_logits is None and self.training and kwargs.get("labels") is not None:
            skip_logits = True
        return causal_lm(self, ctx, *args, skip_logits=skip_logits, **kwargs)

    directory = bad_family("drops_logits", drops_logits)
    build_as_llama(monkeypatch, "drops_logits")
    assert cli.main(["lint", "--deep", "--registry", directory, "--family", "drops_logits"]) == 1
    out = capsys.readouterr().out
    assert "FLCE off: training with labels and skip_logits=None (mode auto): logits missing" in out
    assert "FLCE on:" not in out


def test_lint_deep_reports_a_crashing_forward_instead_of_crashing(bad_family, monkeypatch, capsys):
    def no_skip(self, ctx, *args, skip_logits=None, **kwargs):
        raise RuntimeError("broken forward")

    directory = bad_family("no_skip", no_skip)
    build_as_llama(monkeypatch, "no_skip")
    assert cli.main(["lint", "--deep", "--registry", directory, "--family", "no_skip"]) == 1
    assert "raised RuntimeError: broken forward" in capsys.readouterr().out


# Cohere's apply_rotary_pos_emb rotates interleaved (even, odd) pairs; the rotate_half kernel rotates halves.
INTERLEAVED_AS_HALF = """\
family: interleaved_as_half
model_types: [interleaved_as_half]
module: transformers.models.cohere.modeling_cohere
causal_lm: CohereForCausalLM
kernels:
  rope: {rope}
  swiglu: {{targets: [CohereMLP]}}
head: {{logit_multiplier_attr: logit_scale}}
tiny_config: {{tie_word_embeddings: true, logit_scale: 1.5}}
"""


@pytest.mark.parametrize(
    ("rope", "exit_code"),
    [("{layout: rotate_half}", 1), ("{enabled: false, reason: interleaved pairs}", 0)],
    ids=["wrong-layout", "rope-off"],
)
def test_lint_deep_catches_a_wrong_rope_layout_by_its_logits(tmp_path, monkeypatch, capsys, rope, exit_code):
    """The loss moves by ~1e-5 only (the skip_logits proof's loss check passes); logits and gradients do not."""
    (tmp_path / "interleaved_as_half.yaml").write_text(INTERLEAVED_AS_HALF.format(rope=rope))
    # Without q/k norms (the bundled cohere tiny model has them), the wrong rotation barely moves the loss.
    build_as(monkeypatch, "interleaved_as_half", "cohere", use_qk_norm=False)
    args = [
        "lint",
        "--deep",
        "--registry",
        str(tmp_path),
        "--family",
        "interleaved_as_half",
        "--format",
        "json",
    ]
    assert cli.main(args) == exit_code
    report = json.loads(capsys.readouterr().out)
    messages = [f["message"] for f in report["findings"]]
    if exit_code == 0:
        assert messages == [] and "logits, gradients and loss equal" in report["notes"][-1]["message"]
        return
    assert any(m.startswith("FLCE on: logits differ from the unpatched model's") for m in messages)
    assert any(m.startswith("FLCE on: gradients differ") for m in messages)
    assert not any("skip_logits" in m for m in messages)  # what the lint checked before passes
    located = {(Path(f["file"]).name, f["line"]) for f in report["findings"]}
    assert located == {("interleaved_as_half.yaml", 5)}  # the kernels: key


def test_parity_differences_flag_each_tensor_and_nan():
    import torch

    from liger_registry.lint.parity import Run, differences

    want = Run(torch.ones(2, 3), torch.tensor(1.0), {"w": torch.ones(3), "b": torch.zeros(1)})
    assert differences(Run(want.outputs + 1e-7, want.loss, dict(want.grads)), want, True) == []
    got = Run(want.outputs + 1e-3, torch.tensor(float("nan")), {"w": torch.ones(3) * 1.01})
    problems = differences(got, want, True)
    assert [p.split(" ")[0] for p in problems] == ["logits", "no", "gradients", "loss"]
    assert "worst w" in problems[2] and "e.g. b" in problems[1]


def test_a_family_for_other_transformers_releases_is_a_note_not_an_error(tmp_path, capsys):
    """A family whose `transformers` range leaves out the installed release (InternLM3 on 5.17) is not checked:
    the names it uses may not exist here. Its range in the note; the lint stays clean (exit 0)."""
    (tmp_path / "future.yaml").write_text(
        "family: future\nmodel_types: [no_such_type_yet]\nmodule: transformers.models.no_such.modeling_no_such\n"
        "causal_lm: NoSuchForCausalLM\ntransformers: '>=99'\n"
    )
    args = ["lint", "--deep", "--registry", str(tmp_path), "--family", "future", "--format", "json"]
    assert cli.main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == []
    assert [n["check"] for n in report["notes"]] == ["version"]
    message = report["notes"][0]["message"]
    assert (
        "supports transformers" in message and ">=99" in message and "its checks do not run here" in message
    )


def test_a_duplicate_on_the_registry_path_is_a_finding_naming_both_files(tmp_path, monkeypatch, capsys):
    bundled = liger_registry.load_registry().family_for("llama").path
    (tmp_path / "llama.yaml").write_text(bundled.read_text())
    monkeypatch.setenv("LIGER_REGISTRY_PATH", str(tmp_path))
    assert cli.main(["lint", "--family", "llama", "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("liger-registry: warning: skipped, each duplicates a family loaded before it")
    (finding,) = json.loads(out)["findings"]
    assert finding["file"] == str(tmp_path / "llama.yaml")
    assert f"family 'llama' is already defined in {bundled}" in finding["message"]


def _with_head(**head) -> Registry:
    """The bundled llama family with its head's attribute names replaced, as the only family."""
    loaded = liger_registry.load_registry().family_for("llama")
    entry = loaded.entry.model_copy(update={"head": loaded.entry.head.model_copy(update=head)})
    return Registry({"llama": LoadedFamily(entry, loaded.path)}, {"llama": "llama"})


@pytest.mark.parametrize("head", [{"lm_head": "save_pretrained"}, {"base_model": "generate"}])
def test_lint_flags_a_head_attribute_that_is_a_method_not_a_module(head):
    ((key, name),) = head.items()
    findings = [f for f in lint(registry=_with_head(**head)) if f.severity == "error"]
    assert [f.check for f in findings] == ["head"]
    assert f"head.{key}: LlamaForCausalLM.{name} is a method, not a module" in findings[0].message
