"""Settings that used to be dropped without a word: a policy naming no family, a per-instance kernel switch that
a class-wide patch makes void; and where each registry policy came from."""

from __future__ import annotations

import pytest

import liger_registry as L
from liger_registry.registry.errors import PatchError, RegistryError
from liger_registry.registry.loader import PATH_VARIABLE, load_registry
from liger_registry.testing import tiny_model

POLICY = "policy: {name}\napplies_to: [{to}]\nreason: r\nflce: {{chunk_mem_const: 4}}\n"


@pytest.mark.reliability("silent_wrong")
@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("lama", "'lama' is not a family.*did you mean 'llama'"),
        ("mllama_text_model", "model type of family 'mllama_text'"),
    ],
)
def test_policy_naming_no_family_is_an_error(to, message, tmp_path, monkeypatch, cases) -> None:
    cases.tried(2)
    path = tmp_path / "p.yaml"
    path.write_text(POLICY.format(name="p", to=to))
    with pytest.raises(RegistryError, match=message):
        L.explain("llama", policy=path)
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path))
    with pytest.raises(RegistryError, match=rf"p\.yaml: applies_to: .*{message}"):
        load_registry()


@pytest.mark.reliability("silent_wrong")
def test_instance_switch_voided_by_a_class_wide_patch_is_an_error(cases) -> None:
    model = tiny_model("llama")
    cases.tried(3)
    with L.patched("llama") as class_wide:
        with pytest.raises(
            PatchError, match="rms_norm=off cannot take effect.*LlamaRMSNorm.*apply\\('llama'\\)"
        ):
            L.apply(model, rms_norm=False)
        with pytest.raises(PatchError, match="rope=off cannot take effect"):
            L.apply(model, rope=False)
        assert L.patch_handle(model) is class_wide  # no patch of its own
    L.apply(model, rms_norm=False).revert()  # without the class-wide patch the switch takes effect


@pytest.mark.reliability("silent_wrong")
def test_policy_from_the_path_is_labelled_with_its_file(tmp_path, monkeypatch, cases) -> None:
    cases.tried()
    (tmp_path / "mine.yaml").write_text(POLICY.format(name="everywhere", to="'*'"))
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path))
    explanation = L.explain("llama")
    source = str(explanation.source("flce.chunk_mem_const"))
    assert source.startswith(PATH_VARIABLE) and "mine.yaml" in source and "bundled" not in source
    assert f"everywhere ({PATH_VARIABLE}: {tmp_path / 'mine.yaml'})" in str(explanation)
