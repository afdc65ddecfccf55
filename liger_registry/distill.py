"""Distillation: the generalised JSD between a student's and a teacher's next-token distributions, computed by
fused linear JSD from their last hidden states (neither model's logits are materialised).

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
from liger_registry.constants import IGNORE_INDEX
from liger_registry.forwards.head import head_parameters
from liger_registry.registry.configure import configure, unwrap_model
from liger_registry.registry.loader import Registry
from liger_registry.schemas import FamilyEntry


def _entry(model: Any, registry: Registry | None, policy=None, **overrides: Any) -> FamilyEntry:
    entry = configure(model, policy, registry, **overrides).entry
    if entry.head is None:
        raise ValueError(f"family {entry.family!r} has no causal-LM head: there is nothing to distil through")
    return entry


def _hidden_and_head(model: Any, entry: FamilyEntry, inputs: Mapping[str, Any]):
    inner = unwrap_model(model)
    hidden = getattr(inner, entry.head.base_model)(**inputs).last_hidden_state
    params = head_parameters(getattr(inner, entry.head.lm_head))
    if params is None or params[1] is not None:
        raise ValueError(
            f"{type(inner).__name__}: the head is not one bias-free linear projection; fused JSD needs one"
        )
    return hidden.reshape(-1, hidden.shape[-1]), params[0]


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
    student_hidden, student_weight = _hidden_and_head(student, entry, inputs)
    with torch.no_grad():
        teacher_hidden, teacher_weight = _hidden_and_head(teacher, teacher_entry, inputs)
    labels = batch.get("labels")
    target = None
    if labels is not None:
        target = F.pad(labels, (0, 1), value=ignore_index)[..., 1:].reshape(-1).to(student_hidden.device)
    return kernels.fused_linear_jsd(
        student_hidden,
        student_weight,
        teacher_hidden,
        teacher_weight,
        target,
        jsd_beta=jsd_beta,
        temperature=temperature,
        ignore_index=ignore_index,
        chunk_mem_const=entry.fused_linear_jsd.chunk_mem_const,
    )
