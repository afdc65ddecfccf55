"""Distillation through two fused heads: a divergence between the student's and the teacher's next-token
distributions at a temperature (generalised JSD, forward KL or reverse KL), optionally mixed with the
student's cross entropy on hard labels; neither model's [N, V] logits are materialised.

``loss = soft_weight * D + hard_weight * CE``. ``D`` is :func:`liger_registry.kernels.fused_linear_jsd`:
with student ``Q`` and teacher ``P`` (both at ``temperature``), ``forward_kl`` is ``KL(P || Q)``,
``reverse_kl`` is ``KL(Q || P)``, ``jsd`` is ``beta KL(P || M) + (1 - beta) KL(Q || M)`` with
``M = beta P + (1 - beta) Q`` (TRL's ``generalized_jsd_loss`` convention); summed over the vocabulary,
averaged over the tokens whose target is not ``ignore_index`` (every token without targets). ``CE`` is the
student's mean cross entropy at temperature 1 (fused linear cross entropy). Gradients reach the student only.
"""

from __future__ import annotations

import torch

from liger_registry import kernels
from liger_registry.constants import IGNORE_INDEX

from .output import AlignmentOutput, detached

DIVERGENCES = ("jsd", "forward_kl", "reverse_kl")


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() not in (2, 3):
        raise ValueError(f"{name} must be [B, T, H] or [N, H]; got {tuple(x.shape)}")
    return x.reshape(-1, x.shape[-1])


def _jsd_beta(divergence: str, beta: float) -> float:
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence={divergence!r}; expected one of {', '.join(DIVERGENCES)}")
    return {"forward_kl": 0.0, "reverse_kl": 1.0}.get(divergence, float(beta))


def distillation_loss(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    target: torch.Tensor | None = None,
    *,
    divergence: str = "jsd",
    beta: float = 0.5,
    temperature: float = 1.0,
    soft_weight: float = 1.0,
    hard_weight: float = 0.0,
    ignore_index: int = IGNORE_INDEX,
    chunk_mem_const: int = 1,
) -> AlignmentOutput:
    """Distillation loss (see the module docstring). Hidden states [B, T, H] or [N, H] (the teacher's width
    may differ), bias-free heads [V, H] of one vocabulary, ``target`` [B, T] / [N] next tokens or None
    (``hard_weight`` needs it). ``chunk_mem_const``: the fused JSD's own chunk knob.
    Metrics: soft_loss, hard_loss (when hard_weight > 0)."""
    jsd_beta = _jsd_beta(divergence, beta)
    sh, th = _rows(student_hidden, "student_hidden"), _rows(teacher_hidden, "teacher_hidden")
    flat_target = None if target is None else target.reshape(-1).to(device=sh.device, dtype=torch.int64)
    if flat_target is not None and flat_target.shape[0] != sh.shape[0]:
        raise ValueError(f"target must have one entry per token ({sh.shape[0]}); got {tuple(target.shape)}")
    if hard_weight and flat_target is None:
        raise ValueError("hard_weight > 0 needs the target tokens")
    soft = kernels.fused_linear_jsd(
        sh,
        student_weight,
        th,
        teacher_weight,
        flat_target,
        jsd_beta=jsd_beta,
        temperature=temperature,
        ignore_index=ignore_index,
        chunk_mem_const=chunk_mem_const,
    )
    metrics = {"soft_loss": soft}
    loss = float(soft_weight) * soft
    if hard_weight:
        hard = kernels.fused_linear_cross_entropy(
            sh, student_weight, flat_target, ignore_index=ignore_index, chunk_mem_const=chunk_mem_const
        )
        metrics["hard_loss"] = hard
        loss = loss + float(hard_weight) * hard
    return AlignmentOutput(loss, detached(**metrics))
