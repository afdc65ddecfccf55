"""Every MoE family (forward causal_lm_moe) against the unpatched model with the router logits switched on by
argument and by config: loss and aux loss equal (fp32, tiny models; on CUDA too when present, as `gpu`)."""

from __future__ import annotations

import pytest
import torch
import transformers
from parity_harness import REGISTRY, ROUTER_LOSS_BROKEN

import liger_registry as L
from liger_registry.forwards.context import reads_router_logits_from_config
from liger_registry.registry.targets import version_problem
from liger_registry.testing import tiny_batch, tiny_model

MOE = sorted(name for name, loaded in REGISTRY.families.items() if loaded.entry.forward == "causal_lm_moe")
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        id="gpu",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
        ],
    ),
]


def _skip_broken(family: str) -> None:
    entry = REGISTRY.families[family].entry
    why = entry.broken_on(transformers.__version__) or version_problem(entry)
    if ROUTER_LOSS_BROKEN.get(family):
        why = f"transformers {transformers.__version__}: the original {family} forward cannot compute the router loss"
    if why:
        pytest.skip(why)


def _run(model, batch: dict, by: str):
    """A training-mode forward with the router logits on `by` argument or by config, seeded (router jitter)."""
    torch.manual_seed(0)
    kwargs = {"output_router_logits": True} if by == "argument" else {}
    return model(**batch, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("by", ["argument", "config"])
@pytest.mark.parametrize("family", MOE)
def test_router_aux_loss_as_unpatched(family: str, by: str, device: str) -> None:
    _skip_broken(family)
    model = tiny_model(REGISTRY.families[family].entry.model_types[0]).to(device).train()
    model.config.get_text_config().output_router_logits = by == "config"
    batch = {k: v.to(device) for k, v in tiny_batch(model).items()}
    expected = _run(model, batch, by)
    if by == "config" and not reads_router_logits_from_config(type(model).forward):
        # this release's original head does not fall back to the config (JetMoE, Qwen3.5-MoE, Qwen3-VL-MoE on
        # transformers 5.17): the patched forward must not either
        assert expected.aux_loss is None
        with L.patched(model):
            assert _run(model, batch, by).aux_loss is None
        return
    assert expected.aux_loss is not None, (
        "the unpatched model computed no aux loss: the test switched nothing on"
    )
    with L.patched(model):
        got = _run(model, batch, by)
    assert got.aux_loss is not None, (
        f"{family}: router logits on by {by}: the patched forward dropped the aux loss"
    )
    torch.testing.assert_close(got.aux_loss, expected.aux_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", MOE)
def test_router_logits_off_by_config_adds_no_aux_loss(family: str) -> None:
    """The other side: config off and no argument, neither computes the aux loss."""
    _skip_broken(family)
    model = tiny_model(REGISTRY.families[family].entry.model_types[0]).train()
    model.config.get_text_config().output_router_logits = False
    batch = tiny_batch(model)
    expected = _run(model, batch, "config")
    with L.patched(model):
        got = _run(model, batch, "config")
    assert got.aux_loss is None and expected.aux_loss is None
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)


def test_the_config_fallback_is_read_from_the_installed_forward() -> None:
    """Releases differ (JetMoE's 5.17 head defaults output_router_logits to False, its 5.25 head reads the
    config): the forward's own source decides, and what apply binds is what the installed original does."""

    def reads_the_config(self, output_router_logits=None):
        return output_router_logits if output_router_logits is not None else self.config.output_router_logits

    def defaults_off(self, output_router_logits=False):
        return output_router_logits

    assert reads_router_logits_from_config(reads_the_config)
    assert not reads_router_logits_from_config(defaults_off)
    for family in ("gpt_oss", "jetmoe"):
        entry = REGISTRY.families[family].entry
        model = tiny_model(entry.model_types[0])
        with L.patched(model):
            bound = model.forward.__liger_context__.router_logits_from_config
        original = type(model).forward
        assert bound == reads_router_logits_from_config(original), family
