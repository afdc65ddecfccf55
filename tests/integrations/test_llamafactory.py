"""The LLaMA-Factory hook: `enable_liger_kernel` routed to liger_registry. LLaMA-Factory 0.9.5 does not import
beside TRL 1.x, so `load_model`'s documented sequence runs on a stand-in loader module: the config-time hook
`apply_liger_kernel(config, model_args, is_trainable, require_logits)`, then `patch_model` on the loaded model."""

from __future__ import annotations

import types
from dataclasses import dataclass

import pytest
import torch

import liger_registry as L
from liger_registry.integrations import llamafactory
from liger_registry.testing import tiny_batch, tiny_config, tiny_model


@dataclass
class ModelArguments:
    enable_liger_kernel: bool = True


@dataclass
class FinetuningArguments:
    stage: str = "sft"


def stand_in_loader(model_type: str = "llama") -> types.ModuleType:
    """LLaMA-Factory's loader as load_model uses it; its own hook needs the liger-kernel package."""
    loader = types.ModuleType("stand_in_llamafactory_loader")
    loader.patched_by_llamafactory = []

    def apply_liger_kernel(config, model_args, is_trainable, require_logits):
        if is_trainable and model_args.enable_liger_kernel:
            raise ImportError("No module named 'liger_kernel'")

    def patch_model(model, tokenizer, model_args, is_trainable, add_valuehead):
        loader.patched_by_llamafactory.append(model)

    def load_model(tokenizer, model_args, finetuning_args, is_trainable=False, add_valuehead=False):
        config = tiny_config(model_type)
        loader.apply_liger_kernel(
            config, model_args, is_trainable, require_logits=(finetuning_args.stage not in ["pt", "sft"])
        )
        model = tiny_model(model_type)
        loader.patch_model(model, tokenizer, model_args, is_trainable, add_valuehead)
        return model

    loader.apply_liger_kernel, loader.patch_model, loader.load_model = (
        apply_liger_kernel,
        patch_model,
        load_model,
    )
    return loader


@pytest.fixture
def loader():
    loader = stand_in_loader()
    installed = llamafactory.install(loader, parser=types.ModuleType("no_parser"))
    yield loader
    installed.uninstall()
    for handle in installed.handles:
        handle.revert()


def test_sft_gets_fused_linear_cross_entropy(loader):
    model = loader.load_model(None, ModelArguments(), FinetuningArguments("sft"), is_trainable=True)
    assert loader.patched_by_llamafactory == [model]  # LLaMA-Factory's own patch_model still runs
    handle = L.patch_handle(model)
    assert handle is not None and {"rms_norm", "rope", "swiglu", "forward"} <= {
        r.kernel for r in handle.report.patched
    }
    model.train()
    out = model(**tiny_batch(model))
    reference = tiny_model("llama").train()(**tiny_batch(model))
    assert out.logits is None
    torch.testing.assert_close(out.loss, reference.loss, rtol=1e-5, atol=1e-6)


def test_stages_that_read_logits_keep_them(loader):
    model = loader.load_model(None, ModelArguments(), FinetuningArguments("dpo"), is_trainable=True)
    entry = L.patch_handle(model).report.config.entry
    assert not entry.flce.enabled and entry.skip_logits == "never"
    model.train()
    assert model(**tiny_batch(model)).logits is not None


@pytest.mark.parametrize("enable,trainable", [(False, True), (True, False)])
def test_not_enabled_or_not_training_patches_nothing(loader, enable, trainable):
    model = loader.load_model(None, ModelArguments(enable), FinetuningArguments(), is_trainable=trainable)
    assert L.patch_handle(model) is None


def test_unsupported_model_type_warns_and_loads_unpatched():
    config = types.SimpleNamespace(model_type="not_a_model")
    with pytest.warns(UserWarning, match="not_a_model"):
        assert llamafactory.apply_liger_kernel(config, ModelArguments(), True, False) is None


def test_uninstall_restores_llamafactorys_hooks():
    loader = stand_in_loader()
    own = (loader.apply_liger_kernel, loader.patch_model)
    installed = llamafactory.install(loader, parser=types.ModuleType("no_parser"))
    assert (loader.apply_liger_kernel, loader.patch_model) != own
    installed.uninstall()
    assert (loader.apply_liger_kernel, loader.patch_model) == own


def test_parser_stops_requiring_liger_kernel_only():
    parser = types.ModuleType("stand_in_parser")
    checked = []

    def check_version(requirement, mandatory=False):
        checked.append(requirement)
        raise ImportError(f"{requirement} is required")

    parser.check_version = check_version
    installed = llamafactory.install(stand_in_loader(), parser=parser)
    parser.check_version("liger-kernel", mandatory=True)  # LLaMA-Factory's check for enable_liger_kernel
    with pytest.raises(ImportError, match="unsloth"):
        parser.check_version("unsloth", mandatory=True)
    assert checked == ["unsloth"]
    installed.uninstall()
    assert parser.check_version is check_version
