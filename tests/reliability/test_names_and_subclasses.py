"""What a family may name and what an apply may replace: targets and functions defined under transformers only
(never a torch class re-exported by a modeling module), no silent replacement of a user subclass's override,
head attributes that exist, tiny_config without code-loading keys."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from transformers.models.llama import modeling_llama

import liger_registry as L
from liger_registry import lint
from liger_registry.registry.errors import PatchError
from liger_registry.registry.loader import LoadedFamily, load_registry
from liger_registry.schemas import FamilyEntry
from liger_registry.testing import tiny_batch, tiny_model

FALCON = "transformers.models.falcon.modeling_falcon"


def _registry(**changes):
    """The bundled registry with the llama entry changed (validated like a YAML file would be)."""
    registry = load_registry()
    loaded = registry.families["llama"]
    data = loaded.entry.model_dump(exclude_unset=True)
    for key, value in changes.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    registry.families["llama"] = LoadedFamily(FamilyEntry.model_validate(data), loaded.path)
    return registry


@pytest.mark.reliability("silent_wrong")
def test_torch_class_via_a_modeling_module_is_refused(cases) -> None:
    forward = torch.nn.LayerNorm.forward
    registry = _registry(kernels={"layer_norm": {"targets": [f"{FALCON}:LayerNorm"]}})
    cases.tried(2)
    with pytest.raises(PatchError, match="torch.nn.modules.normalization.LayerNorm.*outside transformers"):
        L.apply("llama", registry=registry)
    assert torch.nn.LayerNorm.forward is forward
    findings = [str(f) for f in lint._family_findings(registry.families["llama"])]
    assert any("outside transformers" in f for f in findings), findings


@pytest.mark.reliability("silent_wrong")
@pytest.mark.parametrize("name", ["LlamaForCausalLM", "nn", "torch", "logging", f"{FALCON}:LayerNorm"])
def test_function_kernel_must_name_a_function_defined_in_transformers(name, cases) -> None:
    cases.tried()
    registry = _registry(kernels={"rope": {"function": name}})
    before = dict(vars(modeling_llama))
    with pytest.raises(PatchError, match="not a function|outside transformers"):
        L.apply("llama", registry=registry)
    assert dict(vars(modeling_llama)) == before


class MyLlama(modeling_llama.LlamaForCausalLM):
    """A user subclass whose forward adds a regulariser of +100 to the loss."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.loss = out.loss + 100.0
        return out


class MyNorm(modeling_llama.LlamaRMSNorm):
    def forward(self, hidden_states):
        return super().forward(hidden_states) * 2.0


@pytest.mark.reliability("silent_wrong")
def test_subclass_with_own_forward_is_refused_not_replaced(cases) -> None:
    base = tiny_model("llama")
    model = MyLlama(base.config)
    model.load_state_dict(base.state_dict())
    batch = tiny_batch(model)
    with torch.no_grad():
        plain = base(**batch).loss
        reference = model(**batch).loss
    torch.testing.assert_close(reference, plain + 100.0)
    cases.tried(2)
    with pytest.raises(PatchError, match="MyLlama .* overrides forward"):
        L.apply(model)
    assert "forward" not in vars(model)
    model.train()
    with L.patched("llama"), torch.no_grad():  # class-wide: the override stays, super() runs the kernel
        torch.testing.assert_close(model(**batch).loss, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.reliability("silent_wrong")
def test_norm_subclass_keeps_its_forward(cases) -> None:
    model = tiny_model("llama")
    layer = model.model.layers[0]
    custom = MyNorm(layer.input_layernorm.weight.shape[0], eps=layer.input_layernorm.variance_epsilon)
    layer.input_layernorm = custom
    batch = tiny_batch(model)
    with torch.no_grad():
        reference = model(**batch).loss
    cases.tried(2)
    with pytest.raises(PatchError, match="MyNorm .* overrides forward"):
        L.apply(model)
    with pytest.warns(UserWarning, match="MyNorm"):
        handle = L.apply(model, strict=False)
    try:
        assert "forward" not in vars(custom)
        with torch.no_grad():
            torch.testing.assert_close(model(**batch).loss, reference, rtol=1e-4, atol=1e-4)
    finally:
        handle.revert()


@pytest.mark.reliability("silent_wrong")
@pytest.mark.parametrize(
    "head",
    [
        {"softcap_attr": "final_logit_sofcapping"},
        {"logit_scale_attr": "logits_scalling"},
        {"logit_multiplier_attr": "lm_head_multiplier"},
        {"lm_head": "lm_haed"},
        {"base_model": "modle"},
    ],
    ids=lambda h: next(iter(h)),
)
def test_misspelt_head_attribute_is_an_error(head, cases) -> None:
    ((key, name),) = head.items()
    registry = _registry(head=head)
    model = tiny_model("llama", registry=registry)
    cases.tried()
    with pytest.raises(PatchError, match=rf"'llama'.*head\.{key}.*{name}"):
        L.apply(model, registry=registry)
    assert "forward" not in vars(model)
    cases.tried()
    if key.endswith("_attr"):
        findings = [str(f) for f in lint._family_findings(registry.families["llama"])]
    else:  # a module attribute: only a built model shows it, so lint --deep
        findings = [str(f) for f in lint.deep_check(registry.families["llama"], registry)]
    assert any(f"head.{key}" in f and name in f for f in findings), findings


@pytest.mark.reliability("raw_exception")
def test_optional_head_attribute_may_be_absent(cases) -> None:
    cases.tried(2)
    registry = _registry(
        head={"softcap_attr": "final_logit_softcapping", "optional_attrs": ["final_logit_softcapping"]}
    )
    model = tiny_model("llama", registry=registry)
    L.apply(model, registry=registry).revert()
    with pytest.raises(ValidationError, match="optional_attrs"):
        _registry(head={"optional_attrs": ["nothing_named"]})


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize(
    "tiny",
    [
        {"_attn_implementation": "kernels-community/flash-attn"},
        {"attn_implementation": "someone/remote"},
        {"auto_map": {"AutoModel": "x.Y"}},
        {"trust_remote_code": True},
        {"_private": 1},
        {"text_config": {"_attn_implementation": "someone/remote"}},
        {"experts_implementation": "hub/kernel"},
        {"layer_types": [{"nested": "mapping"}]},
    ],
    ids=str,
)
def test_tiny_config_takes_only_plain_fields(tiny, cases) -> None:
    cases.tried()
    with pytest.raises(ValidationError, match="tiny_config"):
        _registry(tiny_config=tiny)
