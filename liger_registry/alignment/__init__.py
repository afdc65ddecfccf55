"""Alignment and distillation losses through the fused head: DPO, ORPO, SimPO, KTO, GRPO (with the other RL
losses of TRL's GRPOTrainer) and distillation, computed from hidden states and the lm_head weight chunk by chunk
(never the full [B*T, V] logits).

:func:`add_fused_lm_head` / :func:`use_for_trl_fused_head`: our RL head behind TRL's fused-LM-head contract (its
trainers, GRPOTrainer first, run it instead of TRL's head).

Each loss returns an :class:`AlignmentOutput` (``loss``, ``metrics``). Targets are next tokens aligned with
the hidden states (:func:`next_token_target` from HF-style labels). See docs/alignment.md.
"""

from __future__ import annotations

from .distillation import DIVERGENCES, distillation_loss
from .dpo import dpo_loss
from .entropy import token_log_probs_and_entropy
from .grpo import LOSS_TYPES as GRPO_LOSS_TYPES
from .grpo import GrpoOptions, grpo_loss, vllm_importance_sampling_ratio
from .head_options import HeadOptions
from .kto import kto_loss, kto_reference_kl
from .logprobs import TokenLogProbs, next_token_target, reference_log_probs, token_log_probs
from .model_head import ModelHead, model_head
from .orpo import orpo_loss
from .output import AlignmentOutput
from .simpo import simpo_loss
from .trl_head import (
    FusedHeadOutput,
    TrlHeadSwitch,
    add_fused_lm_head,
    remove_fused_lm_head,
    use_for_trl_fused_head,
)

__all__ = [
    "DIVERGENCES",
    "GRPO_LOSS_TYPES",
    "AlignmentOutput",
    "FusedHeadOutput",
    "GrpoOptions",
    "HeadOptions",
    "ModelHead",
    "TokenLogProbs",
    "TrlHeadSwitch",
    "add_fused_lm_head",
    "distillation_loss",
    "dpo_loss",
    "grpo_loss",
    "kto_loss",
    "kto_reference_kl",
    "model_head",
    "next_token_target",
    "orpo_loss",
    "reference_log_probs",
    "remove_fused_lm_head",
    "simpo_loss",
    "token_log_probs",
    "token_log_probs_and_entropy",
    "use_for_trl_fused_head",
    "vllm_importance_sampling_ratio",
]
