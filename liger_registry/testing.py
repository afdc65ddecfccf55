"""Tiny random-weight models of a family, built from its config with no download (lint --deep, parity)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from liger_registry.constants import IGNORE_INDEX
from liger_registry.registry.loader import Registry, load_registry
from liger_registry.registry.targets import resolve_class

SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}


def tiny_config(model_type: str, registry: Registry | None = None, **overrides: Any):
    """The family's config with small sizes: SMALL, then the entry's tiny_config, then overrides.

    Only keys the model type's config already has are taken from SMALL, so no family gets an
    attribute its config does not know.
    """
    registry = registry or load_registry()
    entry = registry.family_for(model_type).entry
    config = AutoConfig.for_model(model_type)
    configs = [config] + ([config.get_text_config()] if config.get_text_config() is not config else [])
    for sub in configs:  # a multimodal config's language model gets the small sizes too
        known = sub.to_dict()
        _update(sub, {k: v for k, v in SMALL.items() if k in known})
    _update(config, entry.tiny_config)
    # after the entry, not merged into it: a nested dict then updates the entry's nested sizes instead of replacing them
    _update(config, overrides)
    return config


def _update(config: PretrainedConfig, values: dict[str, Any]) -> None:
    """Set config values; a dict for a nested config (text_config, vision_config) updates that config."""
    for key, value in values.items():
        try:
            current = getattr(config, key, None)
        except RuntimeError:  # a per-layer attribute of a heterogeneous config (Gemma 4) has no global value
            current = None
        if isinstance(value, dict) and isinstance(current, PretrainedConfig):
            _update(current, value)
        else:
            setattr(config, key, value)


def tiny_model(
    model_type: str,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    registry: Registry | None = None,
    **overrides: Any,
):
    """A randomly initialised model of the family's `causal_lm` class (the head FLCE patches), on CPU."""
    registry = registry or load_registry()
    config = tiny_config(model_type, registry, **overrides)
    entry = registry.family_for(model_type).entry
    torch.manual_seed(seed)
    return resolve_class(entry, entry.causal_lm)._from_config(config, dtype=dtype)


def tiny_batch(model, batch: int = 2, seq: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids and labels; for a vision encoder (a `head: null` family such as pixtral), images instead."""
    generator = torch.Generator().manual_seed(seed)
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        config = model.config
        size = config.image_size
        shape = (batch, config.num_channels, size, size)
        return {"pixel_values": torch.randn(shape, generator=generator, dtype=model.dtype)}
    vocab = model.config.get_text_config().vocab_size
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": torch.ones_like(input_ids)}


def _step_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training loss of one forward; a model without a loss (no causal-LM head): mean square of its output."""
    out = model(**batch)
    loss = getattr(out, "loss", None)
    return loss if loss is not None else out[0].float().square().mean()


def loss_and_grads(call, model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward through ``call`` (the model or a compiled wrapper of it): loss, gradients."""
    model.zero_grad(set_to_none=True)
    loss = _step_loss(call, batch)
    loss.backward()
    return loss.detach(), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }


def compiled_sdpa_masks(model, batch: dict[str, torch.Tensor]) -> list[bool]:
    """Whether each SDPA call of ``torch.compile(model)``'s forward on ``batch`` gets an explicit mask (dynamo's
    graphs, captured without compiling them)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture)(**batch)
    return [
        node.kwargs.get("attn_mask") is not None or len(node.args) > 3
        for gm in graphs
        for node in gm.graph.nodes
        if "scaled_dot_product_attention" in str(node.target)
    ]


def rel_diff(got: torch.Tensor, want: torch.Tensor, floor: float = 0.0) -> float:
    """``||got - want|| / max(||want||, floor)`` in fp32 (the absolute norm when both are zero)."""
    diff = (got.float() - want.float()).norm().item()
    scale = max(want.float().norm().item(), floor)
    return diff / scale if scale > 0 else diff


@dataclass
class CompileCheck:
    """A patched tiny model compiled against the same model eager: one training step's loss and gradients."""

    family: str
    loss_rel: float = float("nan")
    grad_rel: float = float("nan")  # the worst parameter's
    compile_s: float = float("nan")  # the first compiled step (compiling forward and backward)
    error: str | None = None
    # Measured only when the compiled step strays from eager: the patched compiled step against the unpatched
    # model compiled the same way. Close means inductor changes the unpatched model alike (not the patch).
    vs_unpatched_loss_rel: float = float("nan")
    vs_unpatched_grad_rel: float = float("nan")

    def ok(self, loss_tol: float, grad_tol: float) -> bool:
        if self.error is not None:
            return False
        if self.loss_rel <= loss_tol and self.grad_rel <= grad_tol:
            return True
        return self.vs_unpatched_loss_rel <= loss_tol and self.vs_unpatched_grad_rel <= grad_tol

    @property
    def as_unpatched(self) -> bool:
        """The compiled step strays from eager, and the unpatched model's compiled step was measured instead."""
        return not math.isnan(self.vs_unpatched_loss_rel)


def compile_check(
    model_type: str,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    backend: str = "inductor",
    registry: Registry | None = None,
    tolerances: tuple[float, float] | None = None,
) -> CompileCheck:
    """Patch the family's tiny model, take one step eagerly and one through ``torch.compile(model)``, and compare.

    With ``tolerances`` (loss, grads) and a compiled step outside them, the unpatched model is compiled too and
    the patched compiled step compared with it (``vs_unpatched_*``). Exceptions of the patched or compiled model
    are recorded in ``error``; the dynamo caches are reset first.
    """
    import liger_registry as L

    registry = registry or load_registry()
    family = registry.family_for(model_type).entry.family
    model = tiny_model(model_type, dtype=dtype, registry=registry).to(device).train()
    batch = {k: v.to(device) for k, v in tiny_batch(model).items()}
    if "labels" in batch:  # a vision encoder's batch (pixtral) is images only
        batch["labels"][:, :3] = IGNORE_INDEX
    check = CompileCheck(family)
    try:
        with L.patched(model, registry=registry):
            eager_loss, eager_grads = loss_and_grads(model, model, batch)
            torch._dynamo.reset()
            start = time.perf_counter()
            loss, grads = loss_and_grads(torch.compile(model, backend=backend), model, batch)
            check.compile_s = time.perf_counter() - start
    except Exception as exc:  # a family's failure is its row of the report, not the end of the run
        check.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return check
    if grads.keys() != eager_grads.keys():
        # Passes only where the unpatched model compiled has gradients for the same parameters as the patched one
        # compiled, close to them (DeepSeek-V4's indexer gets gradients eagerly and none compiled, patched or not).
        _compare_with_unpatched_compile(check, model, batch, backend, loss, grads)
        if check.error is None and not check.as_unpatched:
            check.error = (
                f"gradients of different parameters: {sorted(grads.keys() ^ eager_grads.keys())[:3]}"
            )
        return check
    check.loss_rel, check.grad_rel = _rels(loss, grads, eager_loss, eager_grads)
    if tolerances is not None and not check.ok(*tolerances):
        _compare_with_unpatched_compile(check, model, batch, backend, loss, grads)
    return check


# A parameter's gradient is measured against at least this share of the whole gradient's norm: one that is
# mathematically zero (a top-1 router's normalised weight) holds only rounding, whatever the order of the sums.
GRAD_FLOOR = 1e-4


def _rels(loss, grads, want_loss, want_grads) -> tuple[float, float]:
    """(loss, worst parameter's gradient) relative differences."""
    floor = GRAD_FLOOR * sum(g.float().norm().item() ** 2 for g in want_grads.values()) ** 0.5
    worst = max((rel_diff(grads[n], g, floor) for n, g in want_grads.items()), default=0.0)
    return rel_diff(loss, want_loss), worst


def _compare_with_unpatched_compile(check: CompileCheck, model, batch, backend, loss, grads) -> None:
    torch._dynamo.reset()
    try:
        want_loss, want_grads = loss_and_grads(torch.compile(model, backend=backend), model, batch)
    except Exception as exc:  # the unpatched model does not compile: nothing to compare with
        check.error = f"(unpatched compile) {type(exc).__name__}: {str(exc).strip()[:80]}"
        return
    if want_grads.keys() == grads.keys():
        check.vs_unpatched_loss_rel, check.vs_unpatched_grad_rel = _rels(loss, grads, want_loss, want_grads)
