"""Our RL head behind TRL's fused-LM-head contract: ``add_fused_lm_head`` against TRL's own and against the
model's full logits (every output, gradients of every parameter; temperature, softcap, logit scale, ignored
positions, shift_labels), the switch for TRL's trainers, and GRPOTrainer steps with our head against TRL's."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from liger_registry.alignment import trl_head
from liger_registry.alignment.trl_head import add_fused_lm_head, remove_fused_lm_head, use_for_trl_fused_head
from liger_registry.kernels.rl_head import OUTPUTS
from liger_registry.kernels.rl_head.reference import logit_stats
from liger_registry.testing import tiny_model

trl_utils = pytest.importorskip("trl.trainer.utils")

FAMILIES = ("llama", "gemma2", "cohere")  # plain; final_logit_softcapping; logit_scale


def rel_err(a, r) -> float:
    return ((a.double() - r.double()).norm() / r.double().norm().clamp(min=1e-30)).item()


def _batch(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=g)
    labels = ids.clone()
    labels[:, :4] = -100  # the prompt
    labels[2, 8:] = -100  # padding
    return ids, labels


def _full_logits(model, ids, labels, temperature):
    """Every output from the model's own logits (its softcap and scale applied), [B, T - 1], 0 where ignored."""
    z = model(input_ids=ids).logits[:, :-1].float() / temperature
    target = labels[:, 1:]
    mask = target != -100
    stats = logit_stats(z[mask], target[mask])
    return [x.new_zeros(mask.shape).masked_scatter(mask, x) for x in stats], mask


def _loss(out):
    w = torch.linspace(-1.0, 1.0, out.log_probs.numel()).view(out.log_probs.shape)
    return (out.log_probs * w).sum() + (out.entropy * w.flip(-1)).sum()


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_trl_head_and_full_logits(family):
    ours_model = tiny_model(family)
    trl_model = copy.deepcopy(ours_model)
    ref_model = copy.deepcopy(ours_model)
    add_fused_lm_head(ours_model, temperature=0.7, outputs=OUTPUTS)
    trl_utils.add_fused_lm_head(trl_model, temperature=0.7, outputs=OUTPUTS)
    ids, labels = _batch(ours_model)
    ours = ours_model(input_ids=ids, labels=labels, fused_lm_head=True)
    trl = trl_model(input_ids=ids, labels=labels, fused_lm_head=True)
    full, mask = _full_logits(ref_model, ids, labels, 0.7)
    assert type(ours).__name__ == "FusedHeadOutput"
    assert torch.equal(ours.label_mask, mask) and torch.equal(trl.label_mask, mask)
    assert rel_err(ours.loss, trl.loss) <= 1e-5
    for i, name in enumerate(OUTPUTS):
        a, t = getattr(ours, name), getattr(trl, name)
        assert a.shape == t.shape == mask.shape and a.dtype == t.dtype, name
        if name == "is_top1":
            assert torch.equal(a, t) and torch.equal(a, full[i].bool()), name
        else:
            assert rel_err(a, t) <= 1e-5 and rel_err(a, full[i]) <= 1e-5, (name, rel_err(a, full[i]))
    _loss(ours).backward()
    _loss(trl).backward()
    lp, ent = full[0], full[1]
    w = torch.linspace(-1.0, 1.0, lp.numel()).view(lp.shape)
    ((lp * w).sum() + (ent * w.flip(-1)).sum()).backward()
    for (name, p), q, r in zip(
        ours_model.named_parameters(), trl_model.parameters(), ref_model.parameters(), strict=True
    ):
        assert rel_err(p.grad, q.grad) <= 1e-5 and rel_err(p.grad, r.grad) <= 1e-5, name


def test_shift_labels_num_items_and_outputs_not_asked_for():
    model = tiny_model("llama")
    trl_model = copy.deepcopy(model)
    add_fused_lm_head(model)
    trl_utils.add_fused_lm_head(trl_model)
    ids, labels = _batch(model)
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    ours = model(input_ids=ids, shift_labels=shifted, num_items_in_batch=7, fused_lm_head=True)
    trl = trl_model(input_ids=ids, shift_labels=shifted, num_items_in_batch=7, fused_lm_head=True)
    assert ours.log_probs.shape == ids.shape
    assert rel_err(ours.log_probs, trl.log_probs) <= 1e-5 and rel_err(ours.loss, trl.loss) <= 1e-5
    assert ours.entropy is None and ours.is_top1 is None and ours.mean_logits is None


def test_a_peft_lora_head_gets_its_adapter_in_the_fused_head():
    """LoRA on lm_head (and q_proj), the head added before PEFT wraps the model, as GRPOTrainer does: log-probs,
    entropies and every adapter gradient are the PEFT model's own logits'."""
    peft = pytest.importorskip("peft")
    base = tiny_model("llama")
    add_fused_lm_head(base, temperature=0.8, outputs=("log_probs", "entropy"))
    config = peft.LoraConfig(
        r=4, target_modules=["q_proj", "lm_head"], lora_dropout=0.0, init_lora_weights=False
    )
    model = peft.get_peft_model(base, config)
    ids, labels = _batch(model)
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    full, mask = _full_logits(model, ids, labels, 0.8)
    assert rel_err(out.log_probs, full[0]) <= 1e-5 and rel_err(out.entropy, full[1]) <= 1e-5
    adapters = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(_loss(out), adapters)
    want = torch.autograd.grad(_loss(type(out)(log_probs=full[0], entropy=full[1])), adapters)
    assert len(adapters) == 6 and all(rel_err(a, r) <= 1e-5 for a, r in zip(got, want, strict=True))


def test_cast_lm_head_to_fp32_on_a_bf16_model_matches_trl():
    model = tiny_model("gemma2", dtype=torch.bfloat16)
    trl_model = copy.deepcopy(model)
    add_fused_lm_head(model, temperature=0.9, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy"))
    trl_utils.add_fused_lm_head(trl_model, 0.9, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy"))
    ids, labels = _batch(model)
    ours = model(input_ids=ids, labels=labels, fused_lm_head=True)
    trl = trl_model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert ours.log_probs.dtype == trl.log_probs.dtype == torch.float32
    for name in ("log_probs", "entropy"):
        assert rel_err(getattr(ours, name), getattr(trl, name)) <= 1e-5, name
    _loss(ours).backward()
    _loss(trl).backward()
    for p, q in zip(model.parameters(), trl_model.parameters(), strict=True):
        assert p.grad.dtype == torch.bfloat16 and rel_err(p.grad, q.grad) <= 1e-2  # bf16 gradients


def test_forward_without_the_flag_and_generation_are_unchanged():
    model = tiny_model("llama")
    plain = copy.deepcopy(model)
    add_fused_lm_head(model, temperature=0.5, outputs=("log_probs", "entropy"))
    ids, labels = _batch(model)
    a, b = model(input_ids=ids, labels=labels), plain(input_ids=ids, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    gen = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(model.generate(ids[:1], **gen), plain.generate(ids[:1], **gen))
    assert remove_fused_lm_head(model) and not remove_fused_lm_head(model)
    assert "forward" not in model.__dict__ and torch.equal(model(input_ids=ids).logits, b.logits)


def test_bad_arguments_are_clear_errors():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown outputs"):
        add_fused_lm_head(model, outputs=("log_probs", "logits"))
    assert "forward" not in model.__dict__  # refused before the model was touched
    add_fused_lm_head(model)
    with pytest.raises(ValueError, match="needs labels"):
        model(input_ids=_batch(model)[0], fused_lm_head=True)


def test_switch_rebinds_every_trl_module_and_undoes():
    import trl.trainer.grpo_trainer as grpo
    import trl.trainer.rloo_trainer as rloo

    original = trl_utils.add_fused_lm_head
    with use_for_trl_fused_head() as switch:
        assert (
            grpo.add_fused_lm_head is switch.install is trl_utils.add_fused_lm_head is rloo.add_fused_lm_head
        )
        with pytest.raises(RuntimeError, match="already on"):
            use_for_trl_fused_head()
        model = tiny_model("llama")
        grpo.add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
        assert switch.models == [model] and trl_head._ORIGINAL in model.__dict__
    assert grpo.add_fused_lm_head is original is trl_utils.add_fused_lm_head is rloo.add_fused_lm_head
    switch.undo()  # a second undo changes nothing
    assert grpo.add_fused_lm_head is original


# ---------------------------------------------------------------- GRPOTrainer end to end
@pytest.fixture(scope="module")
def grpo_setup(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, eos_token="t1", pad_token="t2", unk_token="t0"
    )
    data = datasets.Dataset.from_dict({"prompt": ["t5 t6 t7", "t8 t9", "t10 t11 t12", "t13"]})
    path = tmp_path_factory.mktemp("tiny")
    tiny_model("llama").save_pretrained(path)  # a path: TRL builds the reference model (beta > 0) from it
    return str(path), tokenizer, data, tmp_path_factory.mktemp("out")


def _reward(completions, **_):
    return [float(len(c) % 3) for c in completions]


def _grpo_run(setup, ours: bool, monkeypatch, device: str = "cpu"):
    from trl import GRPOConfig, GRPOTrainer

    path, tokenizer, data, out = setup
    args = GRPOConfig(
        str(out), max_steps=2, per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
        learning_rate=1e-2, beta=0.04, entropy_coef=0.01, temperature=0.8, logging_steps=1, report_to=[],
        use_cpu=device == "cpu", save_strategy="no", disable_tqdm=True, seed=0, use_vllm=False,
    )  # fmt: skip
    calls = []
    kernel = trl_head.fused_linear_logprobs
    monkeypatch.setattr(trl_head, "fused_linear_logprobs", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    switch = use_for_trl_fused_head() if ours else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = GRPOTrainer(
                model=path, reward_funcs=_reward, args=args, train_dataset=data, processing_class=tokenizer
            )
            trainer.train()
    finally:
        if switch is not None:
            switch.undo()
    return trainer, switch, len(calls)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GRPO_DEVICES = [
    pytest.param("cpu", 1e-4, id="cpu"),
    # TRL's Triton head and ours on the GPU: the same fp32 statistics, summed in another order
    pytest.param("cuda", 1e-3, id="cuda", marks=[pytest.mark.gpu, requires_cuda]),
]


@pytest.mark.parametrize("device,rel", GRPO_DEVICES)
def test_grpo_trainer_steps_with_our_head_match_trl_head(grpo_setup, monkeypatch, device, rel):
    trl_run, _, trl_calls = _grpo_run(grpo_setup, False, monkeypatch, device)
    ours_run, switch, our_calls = _grpo_run(grpo_setup, True, monkeypatch, device)
    assert trl_calls == 0 and our_calls > 0
    assert switch.models == [
        ours_run.model,
        ours_run.ref_model,
    ]  # the policy (entropy asked for) and reference
    logs = [h for h in ours_run.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    first, want = logs[0], trl_run.state.log_history[0]
    for key in ("loss", "entropy", "policy_loss", "grad_norm"):
        assert first[key] == pytest.approx(want[key], rel=rel, abs=1e-7), key
