"""FusedDPOTrainer: TRL's DPOTrainer whose loss is :func:`dpo_loss` on the models' hidden states (the policy's
and the reference's logits are never materialised). Importing this module imports TRL."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from trl import DPOTrainer

from liger_registry.constants import IGNORE_INDEX

from .dpo import dpo_loss
from .logprobs import next_token_target
from .model_head import model_head

_NOT_MODEL_INPUTS = ("completion_mask", "ref_chosen_logps", "ref_rejected_logps")


class FusedDPOTrainer(DPOTrainer):
    """A drop-in for ``trl.DPOTrainer`` (same arguments) computing its ``loss_type="sigmoid"`` loss with
    :func:`liger_registry.alignment.dpo_loss`: same loss, same reference handling (``ref_model``, a PEFT
    model's disabled adapter, or ``precompute_ref_log_probs``), the reward metrics TRL logs.

    Refused at construction, since the fused loss does not compute them: other loss types, f-divergences,
    ``ld_alpha``, ``padding_free``, router auxiliary losses and a non-zero ``label_smoothing`` (which TRL's
    sigmoid loss ignores; :func:`dpo_loss` takes it directly for the conservative form).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        unsupported = {
            "loss_type": list(self.loss_types) != ["sigmoid"],
            "f_divergence_type": self.f_divergence_type != "reverse_kl",
            "ld_alpha": self.ld_alpha is not None,
            "padding_free": bool(getattr(self.args, "padding_free", False)),
            "router_aux_loss_coef": self.aux_loss_enabled,
            "label_smoothing": bool(self.label_smoothing),
        }
        named = [name for name, bad in unsupported.items() if bad]
        if named:
            raise ValueError(
                f"FusedDPOTrainer computes TRL's sigmoid DPO loss only; unsupported here: {', '.join(named)}. "
                "Use trl.DPOTrainer for these, or liger_registry.alignment.dpo_loss directly."
            )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("FusedDPOTrainer computes no logits to return (return_outputs=True)")
        labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, IGNORE_INDEX)
        target = next_token_target(labels)
        model_inputs = {k: v for k, v in inputs.items() if k not in _NOT_MODEL_INPUTS}
        model_inputs["use_cache"] = False
        policy = model_head(model, model_inputs)
        reference = self._reference(model_inputs, inputs)
        out = dpo_loss(
            policy.hidden, policy.weight, target, policy.bias, beta=self.beta, **reference, **policy.options
        )
        mode = "train" if self.model.training else "eval"
        for name, value in out.metrics.items():
            self._metrics[mode][name].append(self.accelerator.gather_for_metrics(value).mean().item())
        return out.loss

    def _reference(self, model_inputs, inputs) -> dict[str, Any]:
        if self.precompute_ref_logps:
            return {"ref_logps": torch.cat([inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]])}
        with torch.no_grad(), self._reference_model() as ref_model:
            ref = model_head(ref_model, model_inputs)
        return {"ref_hidden": ref.hidden, "ref_weight": ref.weight, "ref_bias": ref.bias}

    @contextlib.contextmanager
    def _reference_model(self):
        if self.ref_model is not None:
            yield self.ref_model
            return
        unwrapped = self.accelerator.unwrap_model(self.model)
        if not hasattr(unwrapped, "disable_adapter"):
            raise ValueError(
                "FusedDPOTrainer needs a ref_model, a PEFT model or precompute_ref_log_probs=True"
            )
        adapter = "ref" if "ref" in getattr(unwrapped, "peft_config", {}) else None
        if adapter is None:
            with unwrapped.disable_adapter():
                yield self.model
            return
        from trl.trainer.utils import use_adapter

        with use_adapter(unwrapped, adapter_name=adapter):
            yield self.model
