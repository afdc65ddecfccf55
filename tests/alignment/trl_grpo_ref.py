"""TRL's own GRPO loss as the reference: ``GRPOTrainer._compute_loss`` run on a trainer built without a model,
whose per-token log-probs and entropies come from the materialised logits (fp64) instead of a forward."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import torch
from trl import GRPOConfig, GRPOTrainer

TRL_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.default is not dataclasses.MISSING
}


class OneProcess:
    """The accelerator calls of GRPOTrainer's loss, for a single process."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


class TrlGrpoLoss(GRPOTrainer):
    """GRPOTrainer whose ``_compute_loss`` is TRL's; only the attributes that method reads are set, from
    ``GRPOConfig``'s defaults overridden by ``config`` (TRL's option names), as ``GRPOTrainer.__init__`` sets
    them."""

    def __init__(self, logps: torch.Tensor, entropies: torch.Tensor, use_vllm: bool = False, **config):
        unknown = set(config) - set(TRL_DEFAULTS)
        if unknown:
            raise TypeError(f"not GRPOConfig options: {sorted(unknown)}")
        args = SimpleNamespace(**{**TRL_DEFAULTS, **config, "steps_per_generation": 1})
        self.args, self._logps, self._entropies = args, logps, entropies
        self.model = SimpleNamespace(training=True)
        self.accelerator = OneProcess()
        self.current_gradient_accumulation_steps = 1
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.loss_type, self.beta = args.loss_type, args.beta
        self.importance_sampling_level = args.importance_sampling_level
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
        self.max_completion_length = args.max_completion_length
        self.top_entropy_quantile, self.entropy_coef = args.top_entropy_quantile, args.entropy_coef
        self.use_adaptive_entropy = args.use_adaptive_entropy
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self._last_world_entropy, self._entropy_window_stats = float("inf"), None
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.use_vllm = use_vllm
        self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
        self.aux_loss_enabled = False

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        return self._logps, self._entropies, None

    def metrics(self) -> dict[str, float]:
        return {k: v[-1] for k, v in self._metrics["train"].items()}


def logps_and_entropy(h, w, b, t, temperature=1.0):
    """fp64 per-token log-probs and entropies [B, T] (0 where ignored) from the materialised logits."""
    z = h.double() @ w.double().T + (0 if b is None else b.double())
    logp = torch.log_softmax(z / temperature, -1)
    mask = t != -100
    lp = logp.gather(-1, t.clamp(min=0)[..., None])[..., 0] * mask
    return lp, -(logp.exp() * logp).sum(-1) * mask, mask


def trl_loss(h, w, b, t, adv, *, old=None, ref=None, sampling=None, is_ratio=None, temperature=1.0, **config):
    """(loss, metrics) of TRL's GRPOTrainer on the batch; the completion is every position, the prompt and
    padding positions are masked out as the completion mask of a left-padded prompt would."""
    lp, ent, mask = logps_and_entropy(h, w, b, t, temperature)
    trainer = TrlGrpoLoss(lp, ent, use_vllm=sampling is not None or is_ratio is not None, **config)
    rows, cols = t.shape
    inputs = {
        "prompt_ids": torch.zeros(rows, 0, dtype=torch.long, device=t.device),
        "prompt_mask": torch.zeros(rows, 0, dtype=torch.long, device=t.device),
        "completion_ids": torch.zeros(rows, cols, dtype=torch.long, device=t.device),
        "completion_mask": mask.long(),
        "advantages": adv.double(),
        "num_items_in_batch": mask.sum().double(),
    }
    optional = {
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "sampling_per_token_logps": sampling,
        "importance_sampling_ratio": is_ratio,
    }
    inputs.update({k: v.to(t.device, torch.float64) for k, v in optional.items() if v is not None})
    return trainer._compute_loss(None, inputs), trainer.metrics()


class TrlSamplerRatio:
    """TRL's sampler (vLLM) importance-sampling ratio, as ``GRPOTrainer._generate_and_score_completions``
    computes it: a tiny GRPOTrainer whose generation returns the given completions and sampler log-probs and
    whose model log-probs are the given ``old`` ones."""

    def __init__(self, tmp_dir: str):
        from datasets import Dataset
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        from liger_registry.testing import tiny_model

        words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
        words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=words, eos_token="t1", pad_token="t2", unk_token="t0"
        )
        args = GRPOConfig(
            output_dir=tmp_dir, per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
            report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
        )  # fmt: skip
        self.trainer = GRPOTrainer(
            model=tiny_model("llama"),
            reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["t5 t6", "t7 t8"]}),
            processing_class=tokenizer,
        )
        self.trainer.use_vllm = self.trainer.vllm_importance_sampling_correction = True

    def __call__(self, lengths, old, sampling, mode, clip_min, clip_max) -> torch.Tensor:
        """The ratio of completions of ``lengths`` tokens, ``old`` [B, C] the policy's log-probs and ``sampling``
        [B, C] the sampler's (read up to each length)."""
        completions = [list(range(10, 10 + n)) for n in lengths]
        sampled = [sampling[i, :n].tolist() for i, n in enumerate(lengths)]
        rows = len(lengths)
        texts = [" ".join(f"t{i}" for i in c) for c in completions]
        tr = self.trainer
        tr._generate = lambda prompts: ([[5, 6]] * rows, completions, None, texts, sampled, {}, None, None)
        tr._get_per_token_logps_and_entropies = lambda *a, **k: (old, None, None)
        tr.vllm_importance_sampling_mode = mode
        tr.vllm_importance_sampling_clip_min, tr.vllm_importance_sampling_clip_max = clip_min, clip_max
        return tr._generate_and_score_completions([{"prompt": "t5 t6"}] * rows)["importance_sampling_ratio"]
