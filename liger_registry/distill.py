"""Distillation: the generalised JSD between a student's and a teacher's next-token distributions, computed by
fused linear JSD from their last hidden states (neither model's logits are materialised), with each family's
logit transform as its forward applies it (the head found by ``alignment.model_head``): the logit scale is folded
into the hidden states; a final-logit softcap, which the fused kernel lacks, takes a PyTorch path that materialises
the logits.

The chunk constant is the student family's resolved `fused_linear_jsd.chunk_mem_const` (family entry,
policies, the `jsd_chunk_mem_const` override), independent of FLCE's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from liger_registry import kernels
from liger_registry.alignment.model_head import head_of
from liger_registry.constants import IGNORE_INDEX
from liger_registry.forwards.head import postprocess_logits
from liger_registry.kernels.jsd.reference import jsd_rows_differentiable
from liger_registry.registry.configure import configure, unwrap_model
from liger_registry.registry.loader import Registry
from liger_registry.schemas import FamilyEntry


def _entry(model: Any, registry: Registry | None, policy=None, **overrides: Any) -> FamilyEntry:
    entry = configure(model, policy, registry, **overrides).entry
    if entry.head is None:
        raise ValueError(f"family {entry.family!r} has no causal-LM head: there is nothing to distil through")
    return entry


def _hidden_and_head(model: Any, entry: FamilyEntry, inputs: Mapping[str, Any]):
    """[N, H] hidden states with the family's logit scale folded in (``(h s) W^T = s (h W^T)``), the head
    weight, and the family's softcap (None: none)."""
    head = head_of(model, entry, inputs)
    if head.bias is not None:
        raise ValueError(
            f"{type(unwrap_model(model)).__name__}: the head is not one bias-free linear projection; fused JSD "
            "needs one"
        )
    hidden = head.hidden.reshape(-1, head.hidden.shape[-1])
    scale = head.options["logit_scale"]
    return (hidden * scale if scale != 1.0 else hidden), head.weight, head.options["softcap"]


def _softcapped_jsd(student, teacher, target, *, jsd_beta, temperature, ignore_index) -> torch.Tensor:
    """The JSD of softcapped logits, materialised in PyTorch: the fused kernel applies no softcap."""
    (sh, sw, s_cap), (th, tw, t_cap) = student, teacher
    s_logits = postprocess_logits(sh @ sw.t().to(sh.dtype), s_cap, 1.0)
    with torch.no_grad():  # gradients reach the student only
        t_logits = postprocess_logits(th @ tw.t().to(th.dtype), t_cap, 1.0)
    rows = jsd_rows_differentiable(s_logits, t_logits, float(jsd_beta), float(temperature))
    valid = torch.ones_like(rows, dtype=torch.bool) if target is None else target != ignore_index
    return (rows * valid).sum() / valid.sum().clamp(min=1)


def jsd_loss(
    student: Any,
    teacher: Any,
    batch: Mapping[str, Any],
    *,
    jsd_beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = IGNORE_INDEX,
    policy: str | Path | list | None = None,
    registry: Registry | None = None,
    **overrides: Any,
) -> torch.Tensor:
    """Mean JSD over the tokens whose next-token label is not `ignore_index` (every token without labels).

    `batch` holds the decoder inputs (input_ids, attention_mask, ...) and optionally `labels`, shifted as HF
    shifts them. Gradients reach the student only. `policy` and `overrides` (e.g. jsd_chunk_mem_const=4)
    layer over the student's family as in `apply`.
    """
    entry = _entry(student, registry, policy, **overrides)
    teacher_entry = _entry(teacher, registry)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    student_head = _hidden_and_head(student, entry, inputs)
    with torch.no_grad():
        teacher_head = _hidden_and_head(teacher, teacher_entry, inputs)
    labels = batch.get("labels")
    target = None
    if labels is not None:
        target = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1).to(student_head[0].device)
    if student_head[2] is not None or teacher_head[2] is not None:
        return _softcapped_jsd(
            student_head,
            teacher_head,
            target,
            jsd_beta=jsd_beta,
            temperature=temperature,
            ignore_index=ignore_index,
        )
    return kernels.fused_linear_jsd(
        student_head[0],
        student_head[1],
        teacher_head[0],
        teacher_head[1],
        target,
        jsd_beta=jsd_beta,
        temperature=temperature,
        ignore_index=ignore_index,
        chunk_mem_const=entry.fused_linear_jsd.chunk_mem_const,
    )
