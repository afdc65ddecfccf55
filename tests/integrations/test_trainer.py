"""HF Trainer with a patched model: same losses as unpatched, model_init via the callback, loss-only eval."""

from __future__ import annotations

import pytest
from integration_helpers import args, count_calls, losses, rows
from transformers import Trainer

import liger_registry as L
from liger_registry.integrations import LigerRegistryCallback, LossOnlyEvalMixin
from liger_registry.testing import tiny_model


class LossOnlyTrainer(LossOnlyEvalMixin, Trainer):
    pass


def train(tmp_path, model=None, **kw):
    data = rows(model or tiny_model("llama"))
    trainer = Trainer(model=model, args=args(tmp_path), train_dataset=data, eval_dataset=data, **kw)
    trainer.train()
    return trainer


def test_trainer_losses_match_and_no_logits_in_training(tmp_path):
    reference = losses(train(tmp_path, tiny_model("llama")))
    model = tiny_model("llama")
    with L.patched(model):
        with count_calls(model.lm_head) as calls:
            patched = losses(train(tmp_path, model))
    assert len(reference) == 3
    assert patched == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert calls == [], "training must use fused linear cross entropy, never the lm_head logits"


def test_model_init_is_patched_by_the_callback(tmp_path):
    reference = losses(train(tmp_path, tiny_model("llama")))
    callback = LigerRegistryCallback(liger_kernel_config={"rope": True, "swiglu": False})
    trainer = train(tmp_path, model_init=lambda: tiny_model("llama"), callbacks=[callback])
    try:
        handle = L.patch_handle(trainer.model)
        assert handle is not None and handle.active
        kernels = {r.kernel for r in handle.report.patched}
        assert "swiglu" not in kernels and {"rms_norm", "rope", "forward"} <= kernels
        assert losses(trainer) == pytest.approx(reference, rel=1e-5, abs=1e-6)
    finally:
        callback.revert()
    assert L.patch_handle(trainer.model) is None


def test_callback_rejects_unknown_liger_kernel_config_keys_at_once():
    with pytest.raises(ValueError, match="unknown key 'swigl'.*did you mean 'swiglu'"):
        LigerRegistryCallback(liger_kernel_config={"swigl": True})


def _eval(tmp_path, model, cls=Trainer):
    data = rows(model)
    trainer = cls(model=model, args=args(tmp_path, prediction_loss_only=True), eval_dataset=data)
    with count_calls(model.lm_head) as calls:
        loss = trainer.evaluate()["eval_loss"]
    return loss, len(calls)


def test_loss_only_eval_skips_the_logits(tmp_path):
    reference, ref_calls = _eval(tmp_path, tiny_model("llama"))
    assert ref_calls > 0
    model = tiny_model("llama")
    with L.patched(model):
        # default skip_logits "auto": evaluation (not training) materialises logits, as HF does
        assert _eval(tmp_path, model)[1] > 0
        loss, calls = _eval(tmp_path, model, LossOnlyTrainer)
    assert loss == pytest.approx(reference, rel=1e-5)
    assert calls == 0
    model = tiny_model("llama")
    with L.patched(model, skip_logits="labels"):  # the no-subclass route
        loss, calls = _eval(tmp_path, model)
    assert loss == pytest.approx(reference, rel=1e-5)
    assert calls == 0


def test_loss_only_mixin_leaves_metric_eval_alone(tmp_path):
    model = tiny_model("llama")
    data = rows(model, n=4)
    seen = []

    def metrics(pred):
        seen.append(pred.predictions.shape)
        return {}

    with L.patched(model):
        trainer = LossOnlyTrainer(
            model=model, args=args(tmp_path), eval_dataset=data, compute_metrics=metrics
        )
        trainer.evaluate()
    assert seen and seen[0][-1] == model.config.vocab_size


def _metric_eval(tmp_path, model, cls=Trainer, callbacks=(), **arguments):
    """evaluate() with a compute_metrics that reads the predictions; returns what it got."""
    seen = []

    def metrics(pred):
        seen.append(pred.predictions)
        return {}

    trainer = cls(
        model=model,
        args=args(tmp_path, **arguments),
        eval_dataset=rows(model, n=4),
        compute_metrics=metrics,
        callbacks=list(callbacks),
    )
    trainer.evaluate()
    return seen


@pytest.mark.parametrize("route", ["mixin", "callback"])
def test_skip_logits_labels_warns_when_evaluation_asks_for_predictions(tmp_path, route):
    model = tiny_model("llama")
    if route == "mixin":
        L.apply(model, skip_logits="labels")
        kwargs = {"cls": LossOnlyTrainer}
    else:
        kwargs = {"callbacks": [LigerRegistryCallback(skip_logits="labels")]}
    with pytest.warns(UserWarning, match="skip_logits='labels'") as caught:
        seen = _metric_eval(tmp_path, model, **kwargs)
    assert seen == [()]  # what compute_metrics gets: no logits, as the warning says
    message = str(next(w.message for w in caught if "skip_logits='labels'" in str(w.message)))
    assert "skip_logits='auto'" in message and "prediction_loss_only=True" in message
    L.revert(model)


@pytest.mark.parametrize("route", ["mixin", "callback"])
def test_skip_logits_labels_is_quiet_for_loss_only_evaluation(tmp_path, route, recwarn):
    model = tiny_model("llama")
    if route == "mixin":
        L.apply(model, skip_logits="labels")
        kwargs = {"cls": LossOnlyTrainer}
    else:
        kwargs = {"callbacks": [LigerRegistryCallback(skip_logits="labels")]}
    assert _metric_eval(tmp_path, model, prediction_loss_only=True, **kwargs) == []
    assert not [w for w in recwarn if "skip_logits" in str(w.message)]
    L.revert(model)
