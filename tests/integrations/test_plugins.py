"""Plugins: families and forwards from the `liger_registry.families` entry point, LIGER_REGISTRY_PATH and
load_registry(dir); a YAML file names only registered forwards and modules under transformers."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest
import torch

import liger_registry as L
from liger_registry.forwards import registry as forwards_table
from liger_registry.registry.loader import ENTRY_POINT_GROUP, PATH_VARIABLE
from liger_registry.testing import tiny_batch, tiny_model

FAMILY = """\
family: {family}
model_types: [diffllama]
module: transformers.models.diffllama.modeling_diffllama
causal_lm: DiffLlamaForCausalLM
forward: {forward}
kernels:
  rms_norm: {{targets: [DiffLlamaRMSNorm], casting_mode: llama, offset: 0.0}}
  swiglu: {{targets: [DiffLlamaMLP]}}
"""

PLUGIN = '''\
"""A third-party plugin: registers a forward and exposes its directory of family YAML."""
from pathlib import Path

from liger_registry.forwards import register_forward
from liger_registry.forwards.causal_lm import causal_lm

CALLS = []


@register_forward("counting_causal_lm", "causal_lm, counting its calls")
def counting(model, ctx, *args, skip_logits=None, **kwargs):
    CALLS.append(1)
    return causal_lm(model, ctx, *args, skip_logits=skip_logits, **kwargs)


def families():
    return str(Path(__file__).with_name("families"))
'''


@pytest.fixture
def clean_forwards(monkeypatch):
    monkeypatch.setattr(forwards_table, "_FORWARDS", dict(forwards_table._FORWARDS))


def install_plugin(root, monkeypatch, name="liger_demo_plugin"):
    """An installed distribution on a sys.path directory: a package, its dist-info and entry_points.txt."""
    package = root / name
    (package / "families").mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN)
    (package / "families" / "diffllama.yaml").write_text(
        FAMILY.format(family="diffllama", forward="counting_causal_lm")
    )
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ndiffllama = {name}:families\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_entry_point_plugin_adds_a_family_and_its_forward(tmp_path, monkeypatch, clean_forwards):
    name = install_plugin(tmp_path, monkeypatch)
    assert any(p.value == f"{name}:families" for p in metadata.entry_points(group=ENTRY_POINT_GROUP))
    registry = L.load_registry()
    assert registry.family_for("diffllama").path == tmp_path / name / "families" / "diffllama.yaml"
    model = tiny_model("diffllama", registry=registry)
    batch = tiny_batch(model)
    reference = model(**batch).loss
    model.train()
    with L.patched(model, registry=registry) as handle:
        assert {r.kernel for r in handle.report.patched} == {"rms_norm", "swiglu", "forward"}
        loss = model(**batch).loss
    assert sys.modules[name].CALLS == [1]
    torch.testing.assert_close(loss, reference)


def test_a_plugin_policy_is_labelled_with_its_plugin(tmp_path, monkeypatch, clean_forwards):
    name = install_plugin(tmp_path, monkeypatch)
    (tmp_path / name / "families" / "c4.yaml").write_text(
        "policy: diffllama_c4\napplies_to: [diffllama]\nreason: r\nflce: {chunk_mem_const: 4}\n"
    )
    explanation = L.explain("diffllama", registry=L.load_registry())
    assert str(explanation.source("flce.chunk_mem_const")) == "plugin diffllama policy diffllama_c4 (c4.yaml)"


def test_env_path_and_load_registry_dirs_add_families(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    (first / "diffllama.yaml").write_text(FAMILY.format(family="diffllama", forward="causal_lm"))
    (second / "policy.yaml").write_text(
        "policy: big_chunks\napplies_to: [diffllama]\nreason: fewer chunks\nflce: {chunk_mem_const: 4}\n"
    )
    monkeypatch.setenv(PATH_VARIABLE, f"{first}{__import__('os').pathsep}{second}")
    registry = L.load_registry()
    assert "diffllama" in registry.families and [
        p.policy.policy for p in registry.policies_for("diffllama")
    ] == ["big_chunks"]
    monkeypatch.delenv(PATH_VARIABLE)
    assert "diffllama" not in L.load_registry().families
    assert L.load_registry(first).family_for("diffllama").entry.family == "diffllama"


SIDE_EFFECT = (
    "import pathlib; pathlib.Path(__file__).with_name('IMPORTED').write_text('yes')\nsystem = print\n"
)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("forward", "os.system", "'os.system' is not a registered forward"),
        ("forward", "mypkg.mod", "'mypkg.mod' is not a registered forward"),
        ("module", "mypkg.mod", "module must be a dotted path under 'transformers.'"),
        ("module", "os", "module must be a dotted path under 'transformers.'"),
        (
            "causal_lm",
            "mypkg.mod:Model",
            "causal_lm: 'mypkg.mod:Model' must be a name in the family's module",
        ),
        ("targets", "mypkg.mod:system", "only modules under transformers may be named"),
        ("rope", "mypkg.mod:system", "only modules under transformers may be named"),
    ],
)
def test_yaml_cannot_make_us_import_code(tmp_path, monkeypatch, field, value, message):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text(SIDE_EFFECT)
    (package / "mod.py").write_text(SIDE_EFFECT)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = FAMILY.format(family="diffllama", forward="causal_lm")
    if field == "targets":
        text = text.replace("[DiffLlamaMLP]", f"['{value}']")
    elif field == "rope":
        text += f"  rope: {{function: '{value}'}}\n"
    else:
        text = "\n".join(
            f"{field}: {value}" if line.startswith(f"{field}:") else line for line in text.splitlines()
        )
    directory = tmp_path / "families"
    directory.mkdir()
    (directory / "bad.yaml").write_text(text)
    before = set(sys.modules)
    with pytest.raises(ValueError) as err:
        L.load_registry(directory)
    assert message in str(err.value) and "bad.yaml" in str(err.value)
    assert not (package / "IMPORTED").exists()
    assert not {m for m in set(sys.modules) - before if m.startswith(("mypkg", "os.system"))}


def test_a_plugin_forward_under_a_taken_name_skips_the_plugin_naming_both(
    tmp_path, monkeypatch, clean_forwards
):
    name = install_plugin(tmp_path, monkeypatch, "liger_squatting_plugin")
    init = tmp_path / name / "__init__.py"
    init.write_text(init.read_text().replace('"counting_causal_lm"', '"causal_lm"'))
    ours = forwards_table.get_forward("causal_lm").fn
    with pytest.warns(L.RegistryWarning) as caught:
        registry = L.load_registry()
    message = " ".join(str(w.message) for w in caught)
    assert "'causal_lm'" in message and f"{name}.counting" in message
    assert f"{ours.__module__}.{ours.__qualname__}" in message
    assert "diffllama" not in registry.families
    assert forwards_table.get_forward("causal_lm").fn is ours
