"""A real Trainer with `TrainingArguments(use_liger_kernel=..., liger_kernel_config=...)`: the callback reads the
Trainer's own config; `use_liger_kernel=True` routed to liger_registry (liger-kernel is not installed here)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import transformers.trainer
from integration_helpers import args, count_calls, losses, rows, tiny_gpt2
from transformers import Trainer

import liger_registry as L
from liger_registry.integrations import LigerRegistryCallback, use_liger_kernel_flag
from liger_registry.testing import tiny_model

HOOK = transformers.trainer.apply_liger_kernel


def _kernels(model) -> set[str]:
    return {r.kernel for r in L.patch_handle(model).report.patched}


def _reference(tmp_path) -> list[float]:
    model = tiny_model("llama")
    trainer = Trainer(model=model, args=args(tmp_path), train_dataset=rows(model))
    trainer.train()
    return losses(trainer)


def test_callback_reads_the_trainers_liger_kernel_config(tmp_path):
    reference = _reference(tmp_path)
    model = tiny_model("llama")
    callback = LigerRegistryCallback()
    config = {"swiglu": False, "rope": True, "label_smoothing": 0.0}
    trainer = Trainer(
        model=model,
        args=args(tmp_path, liger_kernel_config=config),
        train_dataset=rows(model),
        callbacks=[callback],
    )
    assert "swiglu" not in _kernels(model) and {"rms_norm", "rope", "forward"} <= _kernels(model)
    with count_calls(model.lm_head) as calls:
        trainer.train()
    assert calls == []
    assert losses(trainer) == pytest.approx(reference, rel=1e-5, abs=1e-6)
    callback.revert()


def test_callbacks_own_keys_win_over_the_trainers():
    callback = LigerRegistryCallback(liger_kernel_config={"swiglu": True, "rms_norm": False})
    model = tiny_model("llama")
    Trainer(model=model, args=args("unused", liger_kernel_config={"swiglu": False}), callbacks=[callback])
    assert "swiglu" in _kernels(model) and "rms_norm" not in _kernels(model)
    callback.revert()


def test_bad_key_in_the_trainers_config_fails_when_the_trainer_is_built():
    with pytest.raises(L.RegistryError, match="unknown key 'swigl'"):
        Trainer(
            model=tiny_model("llama"),
            args=args("unused", liger_kernel_config={"swigl": True}),
            callbacks=[LigerRegistryCallback()],
        )


def test_use_liger_kernel_with_the_callback_says_what_to_do():
    model = tiny_model("llama")
    with pytest.raises(L.RegistryError, match="use_liger_kernel=False") as info:
        Trainer(model=model, args=args("unused", use_liger_kernel=True), callbacks=[LigerRegistryCallback()])
    assert "use_liger_kernel_flag" in str(info.value)
    assert L.patch_handle(model) is None


def _documented_import_error() -> str:
    """The message docs/integrations.md quotes under "`use_liger_kernel=True` on its own"."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text(encoding="utf-8")
    section = doc[doc.index("### `use_liger_kernel=True` on its own") :]
    return section.split("```text\n", 1)[1].split("\n```", 1)[0]


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed")
def test_use_liger_kernel_without_the_route_is_the_documented_import_error(tmp_path):
    """What a user sees with the Trainer flag alone is transformers' own ImportError; the doc quotes it and says
    what to do instead (use_liger_kernel_flag), and the model is not patched."""
    model = tiny_model("llama")
    trainer = Trainer(model=model, args=args(tmp_path, use_liger_kernel=True), train_dataset=rows(model))
    with pytest.raises(ImportError) as info:
        trainer.train()
    documented = _documented_import_error()
    assert str(info.value) == documented.removeprefix("ImportError: ")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text(encoding="utf-8")
    section = doc[doc.index("### `use_liger_kernel=True` on its own") :].split("\n### ", 1)[0]
    assert "use_liger_kernel_flag()" in section and "LigerRegistryCallback" in section
    assert L.patch_handle(model) is None


def test_the_integrations_log_that_they_patched(tmp_path, caplog):
    model = tiny_model("llama")
    trainer = Trainer(
        model=model,
        args=args(tmp_path, use_liger_kernel=True, liger_kernel_config={"swiglu": False}, max_steps=1),
        train_dataset=rows(model),
    )
    with caplog.at_level(logging.INFO, logger="liger_registry"), use_liger_kernel_flag():
        trainer.train()
    messages = [
        r.getMessage() for r in caplog.records if r.name == "liger_registry.integrations.trainer_apply"
    ]
    assert messages == [
        "TrainingArguments(use_liger_kernel=True, liger_kernel_config=...): patched family llama "
        "(LlamaForCausalLM) with swiglu=False"
    ]
    caplog.clear()
    callback = LigerRegistryCallback()
    with caplog.at_level(logging.INFO, logger="liger_registry"):
        Trainer(model=model, args=args(tmp_path), callbacks=[callback])
    messages = [
        r.getMessage() for r in caplog.records if r.name == "liger_registry.integrations.trainer_apply"
    ]
    assert messages == ["LigerRegistryCallback: LlamaForCausalLM keeps its patch (family llama)"]
    L.revert(model)


def test_use_liger_kernel_flag_routes_the_trainer_to_the_registry(tmp_path):
    reference = _reference(tmp_path)
    model = tiny_model("llama")
    config = {"swiglu": False, "chunk_mem_const": 2}
    trainer = Trainer(
        model=model,
        args=args(tmp_path, use_liger_kernel=True, liger_kernel_config=config),
        train_dataset=rows(model),
    )
    with use_liger_kernel_flag() as handles:
        assert transformers.trainer.apply_liger_kernel is not HOOK
        with count_calls(model.lm_head) as calls:
            trainer.train()
    assert transformers.trainer.apply_liger_kernel is HOOK  # restored
    assert len(handles) == 1 and L.patch_handle(model) is handles[0]
    assert "swiglu" not in _kernels(model)
    assert calls == []
    assert losses(trainer) == pytest.approx(reference, rel=1e-5, abs=1e-6)
    # loss-only evaluation: Trainer passes skip_logits=True under use_liger_kernel, the patched forward takes it
    eval_trainer = Trainer(
        model=model,
        args=args(tmp_path, use_liger_kernel=True, prediction_loss_only=True),
        eval_dataset=rows(model),
    )
    with count_calls(model.lm_head) as calls:
        assert eval_trainer.evaluate()["eval_loss"] > 0
    assert calls == []
    L.revert(model)


def test_route_with_the_callback_patches_once(tmp_path):
    model = tiny_model("llama")
    callback = LigerRegistryCallback(liger_kernel_config={"rms_norm": False})
    with use_liger_kernel_flag() as handles:
        trainer = Trainer(
            model=model,
            args=args(tmp_path, use_liger_kernel=True),
            train_dataset=rows(model),
            callbacks=[callback],
        )
        trainer.train()
    assert handles == [] and len(callback.handles) == 1  # the callback patched first; the hook left it
    assert "rms_norm" not in _kernels(model)
    callback.revert()


DIFFERENT = {"swiglu": False, "fused_linear_cross_entropy": False}


def _refused_by(route: str, model, tmp_path, config) -> str:
    """The error of building (callback) or training (flag) a Trainer on `model` with `liger_kernel_config`."""
    if route == "callback":
        callback = LigerRegistryCallback(liger_kernel_config=config)
        with pytest.raises(L.PatchError) as info:
            Trainer(model=model, args=args(tmp_path), train_dataset=rows(model), callbacks=[callback])
        assert callback.handles == []
        return str(info.value)
    trainer = Trainer(
        model=model,
        args=args(tmp_path, use_liger_kernel=True, liger_kernel_config=config),
        train_dataset=rows(model),
    )
    with use_liger_kernel_flag() as handles, pytest.raises(L.PatchError) as info:
        trainer.train()
    assert handles == []
    return str(info.value)


@pytest.mark.parametrize("route", ["callback", "flag"])
def test_a_config_that_differs_from_the_patch_is_refused_naming_the_difference(tmp_path, route):
    model = tiny_model("llama")
    handle = L.apply(model)
    message = _refused_by(route, model, tmp_path, DIFFERENT)
    assert "kernels.swiglu.enabled: patched True, asked False" in message
    assert "flce.enabled: patched True, asked False" in message
    assert "revert" in message
    assert L.patch_handle(model) is handle  # nothing was changed: SwiGLU and the fused loss are still on
    assert {"swiglu", "forward"} <= _kernels(model) and handle.report.config.entry.flce.enabled
    handle.revert()


@pytest.mark.parametrize("route", ["callback", "flag"])
def test_a_kernel_asked_on_that_the_patch_has_off_is_refused(tmp_path, route):
    model = tiny_model("llama")
    handle = L.apply(model, swiglu=False, chunk_mem_const=4)
    message = _refused_by(route, model, tmp_path, {"swiglu": True, "chunk_mem_const": 4})
    assert "kernels.swiglu.enabled: patched False, asked True" in message
    assert "chunk_mem_const" not in message  # the keys that agree are not named
    assert L.patch_handle(model) is handle
    handle.revert()


def test_a_config_that_agrees_with_the_patch_keeps_it(tmp_path):
    """Keys the config names must agree; keys it leaves out keep the patch's values (applied with options)."""
    model = tiny_model("llama")
    # the config's rms_norm=False is the reference's: every RMSNorm, the fused add + norm too
    handle = L.apply(model, rms_norm=False, add_rms_norm=False, chunk_mem_const=4)
    config = {"rms_norm": False, "swiglu": True}
    callback = LigerRegistryCallback(liger_kernel_config=config)
    Trainer(model=model, args=args(tmp_path), train_dataset=rows(model), callbacks=[callback])
    trainer = Trainer(
        model=model,
        args=args(tmp_path, use_liger_kernel=True, liger_kernel_config=config, max_steps=1),
        train_dataset=rows(model),
    )
    with use_liger_kernel_flag() as handles:
        trainer.train()
    assert handles == [] and callback.handles == [] and L.patch_handle(model) is handle
    handle.revert()


def test_strict_false_trains_a_model_type_without_a_family_unpatched(tmp_path):
    reference = Trainer(model=tiny_gpt2(), args=args(tmp_path), train_dataset=rows(tiny_gpt2()))
    reference.train()
    model = tiny_gpt2()
    trainer = Trainer(model=model, args=args(tmp_path, use_liger_kernel=True), train_dataset=rows(model))
    with use_liger_kernel_flag() as handles, pytest.raises(L.UnsupportedModelError, match="scaffold gpt2"):
        trainer.train()
    model = tiny_gpt2()
    trainer = Trainer(
        model=model,
        args=args(tmp_path, use_liger_kernel=True, liger_kernel_config={"swiglu": False}),
        train_dataset=rows(model),
    )
    with use_liger_kernel_flag(strict=False) as handles, pytest.warns(UserWarning, match="scaffold gpt2"):
        trainer.train()
    assert handles == [] and L.patch_handle(model) is None
    assert losses(trainer) == losses(reference)  # unpatched: the same computation


def test_the_callback_with_strict_false_leaves_an_unsupported_model_unpatched(tmp_path):
    model = tiny_gpt2()
    with pytest.raises(L.UnsupportedModelError, match="scaffold gpt2"):
        Trainer(model=model, args=args(tmp_path), callbacks=[LigerRegistryCallback()])
    callback = LigerRegistryCallback(strict=False, liger_kernel_config={"rope": False})
    with pytest.warns(UserWarning, match="scaffold gpt2"):
        trainer = Trainer(model=model, args=args(tmp_path), train_dataset=rows(model), callbacks=[callback])
        trainer.train()
    assert callback.handles == [] and L.patch_handle(model) is None


def test_the_flags_own_overrides_count_as_asked(tmp_path):
    model = tiny_model("llama")
    handle = L.apply(model)
    trainer = Trainer(model=model, args=args(tmp_path, use_liger_kernel=True), train_dataset=rows(model))
    with use_liger_kernel_flag(chunk_mem_const=8), pytest.raises(L.PatchError) as info:
        trainer.train()
    assert "flce.chunk_mem_const: patched 1, asked 8" in str(info.value)
    assert L.patch_handle(model) is handle
    handle.revert()
