"""GrpoOptions: the knobs of the RL policy losses (GRPO and its variants), named and defaulted as TRL's
``GRPOConfig`` names them, validated once."""

from __future__ import annotations

from dataclasses import dataclass, fields

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# the loss types whose per-token term is the clipped surrogate -min(rho A, clip(rho) A)
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
IS_LEVELS = ("token", "sequence")
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class GrpoOptions:
    """Options of :func:`grpo_loss` (defaults: TRL's ``GRPOConfig``; ``epsilon_low`` is its ``epsilon``).

    ``loss_type``: one of :data:`LOSS_TYPES`. ``importance_sampling_level``: ``token`` (one ratio per token) or
    ``sequence`` (GSPO: one ratio per sequence, the exp of the mean log-ratio). ``beta``: KL coefficient;
    ``use_bias_correction_kl`` multiplies the KL by the importance ratio. ``epsilon_low`` / ``epsilon_high``
    (None: ``epsilon_low``): clipping range; for ``cispo`` ``epsilon_high`` caps the ratio itself. ``delta``:
    upper cap of the unclipped ratio (two-sided clipping). ``sapo_temperature_pos`` / ``_neg``: SAPO's gate
    temperatures for positive / other advantages. ``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``,
    ``vespo_lambda_neg``: VESPO's gamma weighting. ``max_completion_length``: ``dr_grpo``'s constant (None:
    the batch's T). ``vllm_importance_sampling_*``: the correction for the sampler's log-probs (applied when
    they are given); ``vllm_importance_sampling_cap``, the older name of ``_clip_max``, replaces it when set.
    ``off_policy_mask_threshold``: drop negative-advantage sequences whose mean KL(sampler || policy) exceeds
    it. ``top_entropy_quantile``: keep the policy term on the top quantile of tokens by entropy.
    ``entropy_coef``: subtract ``entropy_coef`` times the mean per-token entropy.
    """

    loss_type: str = "dapo"
    importance_sampling_level: str = "token"
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    max_completion_length: int | None = None
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_min: float | None = None
    vllm_importance_sampling_clip_max: float | None = 3.0
    vllm_importance_sampling_cap: float | None = None
    off_policy_mask_threshold: float | None = None
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        _one_of("loss_type", self.loss_type, LOSS_TYPES)
        _one_of("importance_sampling_level", self.importance_sampling_level, IS_LEVELS)
        _one_of("vllm_importance_sampling_mode", self.vllm_importance_sampling_mode, VLLM_IS_MODES)
        if not (0.0 <= self.epsilon_low < 1.0 and self.high >= 0.0):
            raise ValueError(
                f"need 0 <= epsilon_low < 1 and epsilon_high >= 0; got {self.epsilon_low}, {self.epsilon_high}"
            )
        if self.beta < 0.0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile}")
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        self._check_vllm_bounds()

    def _check_vllm_bounds(self) -> None:
        lo, hi = self.clip_min, self.clip_max
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(f"vllm_importance_sampling_clip_min ({lo}) must be < clip_max ({hi})")
        if self.vllm_importance_sampling_mode.endswith("truncate") and lo is None and hi is None:
            raise ValueError("a *_truncate vllm_importance_sampling_mode needs clip_min or clip_max")

    @property
    def high(self) -> float:
        """``epsilon_high``, ``epsilon_low`` when not set."""
        return self.epsilon_low if self.epsilon_high is None else float(self.epsilon_high)

    @property
    def clip_min(self) -> float | None:
        return self.vllm_importance_sampling_clip_min

    @property
    def clip_max(self) -> float | None:
        cap = self.vllm_importance_sampling_cap
        return self.vllm_importance_sampling_clip_max if cap is None else cap

    @property
    def needs_entropy(self) -> bool:
        return self.top_entropy_quantile < 1.0 or self.entropy_coef != 0.0


GRPO_OPTION_NAMES = frozenset(f.name for f in fields(GrpoOptions))


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; expected one of {', '.join(allowed)}")
