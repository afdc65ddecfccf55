"""transformers' kernel mapping (`use_kernels=True` with `kernel_config()`) serving liger_registry's layers from a
local `kernels` repository: the layers really replace the forwards, the model computes as unpatched, every route
(from_pretrained, set_use_kernels, kernels.kernelize, TRL's model_init_kwargs) gets them, offline."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings

import pytest
import torch
from integration_helpers import args
from transformers import AutoModelForCausalLM

import liger_registry
import liger_registry.kernels as K
from liger_registry import cli
from liger_registry.integrations import hub_kernels
from liger_registry.integrations.hub_kernels import dispatch, layers
from liger_registry.integrations.hub_kernels.config import _declared_names
from liger_registry.kernels import triton_utils
from liger_registry.testing import loss_and_grads, rel_diff, tiny_batch, tiny_model

kernels = pytest.importorskip("kernels")
try:
    hub_kernels.require_kernels()
except ImportError as exc:  # a kernels release the installed transformers does not take
    pytest.skip(str(exc), allow_module_level=True)


@contextlib.contextmanager
def counting(monkeypatch):
    """Counts the calls of our RMSNorm and RoPE ops (each layer's drop-in looks the op up at call time)."""
    calls = {"rms_norm": 0, "rope": 0}
    for name in calls:
        op = getattr(K, name)

        def counted(*a, _op=op, _name=name, **kw):
            calls[_name] += 1
            return _op(*a, **kw)

        monkeypatch.setattr(K, name, counted)
    yield calls


def unkernelize(model) -> None:
    """Every layer back on its class's forward (kernels releases before 0.19 kernelize a rotary function for the
    whole process, so a test leaves none behind)."""
    keep_own = dict.fromkeys(_declared_names(model), {})  # no device: each layer keeps its forward, quietly
    with kernels.use_kernel_mapping(keep_own, inherit_mapping=False):
        kernels.kernelize(
            model, mode=kernels.Mode.INFERENCE, device=getattr(model, "device", torch.device("cpu")).type
        )


@pytest.fixture
def saved(tmp_path):
    """A tiny model of a type saved as a checkpoint, to load as users do."""

    def save(model_type: str):
        torch.manual_seed(0)
        model = tiny_model(model_type)
        if getattr(model.config, "layer_types", None):  # the default config's list, for its default depth
            model.config.layer_types = model.config.layer_types[: model.config.num_hidden_layers]
        path = tmp_path / model_type
        model.save_pretrained(path)
        return str(path)

    return save


def load(path: str, **kwargs):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)


def test_the_repository_loads_through_kernels(tmp_path, caplog):
    root = hub_kernels.write_repository(tmp_path / "repo")
    assert root.is_absolute() and (root / "build" / "torch-universal" / "metadata.json").is_file()
    meta = json.loads((root / "build" / "torch-universal" / "metadata.json").read_text())
    assert meta["name"] == "liger-registry" and meta["digest"]["files"].keys() == {"__init__.py"}
    with caplog.at_level(logging.WARNING):
        for hub, ours in hub_kernels.LAYERS.items():
            layer = kernels.LocalLayerRepository(repo_path=root, layer_name=ours).load()
            assert layer is {"RMSNorm": layers.RMSNorm, "rotary_pos_emb": layers.RotaryPosEmb}[hub]
    # the digest matches the written module: kernels loads it without a word
    assert not [r for r in caplog.records if "digest" in r.getMessage()]


def unpatched(path: str, batch: dict) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """Training loss and gradients, and eval logits, of the checkpoint loaded without kernels; computed before
    a kernelized model exists (kernels before 0.19 kernelize a rotary function for the whole process)."""
    model = load(path, use_kernels=False)
    model.train()
    loss, grads = loss_and_grads(model, model, batch)
    with torch.no_grad():
        return loss, grads, model.eval()(**batch).logits


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_from_pretrained_kernelizes_with_our_layers_and_computes_as_unpatched(
    saved, model_type, backend, monkeypatch
):
    if backend == "triton" and not triton_utils.INTERPRET_AT_IMPORT:
        pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, backend)
    path = saved(model_type)
    batch = tiny_batch(tiny_model(model_type))
    want_loss, want_grads, want_logits = unpatched(path, batch)
    model = load(path, use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        served = hub_kernels.kernelized_layers(model)
        norms = [
            n for n, m in model.named_modules() if getattr(type(m), "kernel_layer_name", None) == "RMSNorm"
        ]
        assert set(norms) < set(served) and all(served.values())
        assert sum(name.endswith("rotary_pos_emb") for name in served) == model.config.num_hidden_layers
        model.train()  # kernelizes again, for training: our layers stay
        assert hub_kernels.kernelized_layers(model) == served
        with counting(monkeypatch) as calls:
            loss, grads = loss_and_grads(model, model, batch)
        assert calls == {"rms_norm": len(norms), "rope": model.config.num_hidden_layers}
        tol = 1e-6 if backend == "torch" else 1e-5
        assert rel_diff(loss, want_loss) < tol
        assert max(rel_diff(grads[k], want_grads[k]) for k in want_grads) < 10 * tol
        with torch.no_grad():
            assert rel_diff(model.eval()(**batch).logits, want_logits) < tol
    finally:
        unkernelize(model)


def test_gpt_oss_rotary_function_with_one_cos_per_pair(saved):
    """GPT-OSS's rotary function takes cos/sin with one value per pair of dimensions: the layer runs the
    half-split drop-in its family entry names, and the model computes as unpatched."""
    path = saved("gpt_oss")
    batch = tiny_batch(tiny_model("gpt_oss"))
    want_loss, want_grads, want_logits = unpatched(path, batch)
    model = load(path, use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        served = hub_kernels.kernelized_layers(model)
        rotary = [name for name in served if name.endswith("rotary_pos_emb")]
        assert len(rotary) == model.config.num_hidden_layers and all(served.values())
        model.train()
        loss, grads = loss_and_grads(model, model, batch)
        assert rel_diff(loss, want_loss) < 1e-6
        assert max(rel_diff(grads[k], want_grads[k]) for k in want_grads) < 1e-5
        with torch.no_grad():
            assert rel_diff(model.eval()(**batch).logits, want_logits) < 1e-6
    finally:
        unkernelize(model)


def test_apply_adds_the_other_kernels_to_a_kernelized_model(saved):
    """The mapping's norms and rotary functions, apply's fused loss, SwiGLU and fused residual-add norm: the
    unpatched model's loss and gradients; revert takes apply's kernels out and leaves the mapping's layers."""
    path = saved("llama")
    batch = tiny_batch(tiny_model("llama"))
    want_loss, want_grads, _ = unpatched(path, batch)
    model = load(path, use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        handle = liger_registry.apply(model, rms_norm=False, rope=False)
        assert {r.kernel for r in handle.report.patched} >= {"forward", "swiglu", "add_rms_norm"}
        model.train()
        served = hub_kernels.kernelized_layers(model)
        assert len(served) == 7 and all(served.values())
        loss, grads = loss_and_grads(model, model, batch)
        assert rel_diff(loss, want_loss) < 1e-6
        assert max(rel_diff(grads[k], want_grads[k]) for k in want_grads) < 1e-5
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            handle.revert()
        assert hub_kernels.kernelized_layers(model) == served
    finally:
        unkernelize(model)


def test_a_kernelized_model_compiles_in_one_graph(saved):
    path = saved("llama")
    batch = tiny_batch(tiny_model("llama"))
    want_loss, want_grads, _ = unpatched(path, batch)
    model = load(path, use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        model.train()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        loss, grads = loss_and_grads(compiled, model, batch)
        assert all(hub_kernels.kernelized_layers(model).values())
        assert rel_diff(loss, want_loss) < 1e-6
        assert max(rel_diff(grads[k], want_grads[k]) for k in want_grads) < 1e-5
    finally:
        torch._dynamo.reset()
        unkernelize(model)


def test_set_use_kernels_and_kernels_own_kernelize():
    model = tiny_model("llama")
    model.set_use_kernels(True, hub_kernels.kernel_config())
    try:
        assert hub_kernels.kernelized_layers(model) and all(hub_kernels.kernelized_layers(model).values())
    finally:
        unkernelize(model)
    assert not hub_kernels.kernelized_layers(model)
    with kernels.use_kernel_mapping(hub_kernels.kernel_mapping(model=model), inherit_mapping=False):
        kernels.kernelize(model, mode=kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE, device="cpu")
    try:
        assert len(hub_kernels.kernelized_layers(model)) == 7 and all(
            hub_kernels.kernelized_layers(model).values()
        )
    finally:
        unkernelize(model)


def test_one_config_serves_many_loads_and_is_not_rewritten_into_the_model(saved):
    config = hub_kernels.kernel_config()
    first = load(saved("llama"), use_kernels=True, kernel_config=config)
    second = load(saved("qwen3"), use_kernels=True, kernel_config=config)  # TRL's reference model does so
    try:
        assert first.kernel_config is not config and second.kernel_config is not config
        assert all(hub_kernels.kernelized_layers(first).values())
        assert all(hub_kernels.kernelized_layers(second).values())
    finally:
        unkernelize(first), unkernelize(second)


def test_a_class_no_family_serves_keeps_its_own_computation():
    """A layer that declares "RMSNorm" but computes something else (here, no epsilon inside the root and a
    doubled weight) is not one our kernel serves: the bound layer runs the class's own forward."""

    @kernels.use_kernel_forward_from_hub("RMSNorm")
    class OddNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(8))

        def forward(self, hidden_states):
            return 2 * self.weight * hidden_states / hidden_states.pow(2).mean(-1, keepdim=True).sqrt()

    module = OddNorm()
    x = torch.randn(3, 8)
    want = module(x)
    with kernels.use_kernel_mapping(hub_kernels.kernel_mapping(model=module), inherit_mapping=False):
        kernels.kernelize(module, mode=kernels.Mode.TRAINING, device="cpu")
    assert module.forward.__func__ is layers.RMSNorm.forward
    assert hub_kernels.kernelized_layers(module) == {"": False}
    torch.testing.assert_close(module(x), want)
    assert dispatch.norm_forward(OddNorm) is None


def test_a_rotary_function_no_family_serves_keeps_its_own():
    @kernels.use_kernel_forward_from_hub("rotary_pos_emb")
    def scale_only(q, k, cos, sin, unsqueeze_dim=1):  # no family's rotary layout
        return q * cos.unsqueeze(unsqueeze_dim), k * sin.unsqueeze(unsqueeze_dim)

    @kernels.use_kernelized_func(scale_only)
    class Attention(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return scale_only(q, k, cos, sin)

    module = Attention()
    q, k, cos, sin = (
        torch.randn(1, 2, 5, 8),
        torch.randn(1, 1, 5, 8),
        torch.randn(1, 5, 8),
        torch.randn(1, 5, 8),
    )
    want = module(q, k, cos, sin)
    with kernels.use_kernel_mapping(hub_kernels.kernel_mapping(model=module), inherit_mapping=False):
        kernels.kernelize(module, mode=kernels.Mode.TRAINING, device="cpu")
    try:
        assert hub_kernels.kernelized_layers(module) == {"rotary_pos_emb": False}
        for got, expected in zip(module(q, k, cos, sin), want, strict=True):
            torch.testing.assert_close(got, expected)
    finally:
        unkernelize(module)


def test_a_missing_kernels_package_is_an_error_that_says_what_to_install(monkeypatch):
    from transformers.utils import import_utils

    monkeypatch.setattr(import_utils, "is_kernels_available", lambda *a, **k: False)
    with pytest.raises(ImportError, match=r"pip install 'kernels>=\d"):
        hub_kernels.kernel_config()


def test_the_cli_writes_the_repository_and_prints_its_path(tmp_path, capsys):
    assert cli.main(["kernel-repo", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str((tmp_path / "r").resolve())
    assert (
        kernels.LocalLayerRepository(repo_path=tmp_path / "r", layer_name="RMSNorm").load() is layers.RMSNorm
    )


def test_trl_model_init_kwargs_build_the_model_with_our_layers(saved, tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from test_trl import tokenizer

    path = saved("llama")
    ids = torch.randint(3, 128, (8, 12), generator=torch.Generator().manual_seed(0)).tolist()
    data = Dataset.from_dict({"input_ids": ids})

    def run(**init):
        config = args(tmp_path / "out", cls=trl.SFTConfig, max_steps=2, model_init_kwargs=init or None)
        trainer = trl.SFTTrainer(model=path, args=config, train_dataset=data, processing_class=tokenizer(128))
        trainer.train()
        return trainer

    reference = run()
    trainer = run(use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        served = hub_kernels.kernelized_layers(trainer.model)
        assert len(served) == 7 and all(served.values())
        got = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        want = [h["loss"] for h in reference.state.log_history if "loss" in h]
        assert len(got) == 2 and got == pytest.approx(want, rel=1e-5)
    finally:
        unkernelize(trainer.model)


def test_the_readme_section_opens_with_a_snippet_that_runs(run_readme_snippet):
    run_readme_snippet("transformers' kernel mapping (use_kernels)")


def test_trl_grpo_builds_policy_and_reference_model_from_one_config(saved, tmp_path):
    """GRPO with a KL term loads a reference model beside the policy, from the same model_init_kwargs."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from test_trl import tokenizer

    config = trl.GRPOConfig(
        str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        beta=0.1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        model_init_kwargs={"use_kernels": True, "kernel_config": hub_kernels.kernel_config()},
    )
    trainer = trl.GRPOTrainer(
        model=saved("llama"),
        reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["t5 t6 t7"] * 8}),
        processing_class=tokenizer(128),
    )
    try:
        for model in (trainer.model, trainer.ref_model):
            served = hub_kernels.kernelized_layers(model)
            assert len(served) == 7 and all(served.values())
        trainer.train()
        assert all(hub_kernels.kernelized_layers(trainer.model).values())
    finally:
        unkernelize(trainer.model), unkernelize(trainer.ref_model)


def cuda_model(path: str, **kwargs):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda", **kwargs)


def cuda_batch(model_type: str) -> dict[str, torch.Tensor]:
    return {k: v.cuda() for k, v in tiny_batch(tiny_model(model_type), batch=4, seq=64).items()}


def train_step(call, model, batch):
    model.train()
    return loss_and_grads(call, model, batch)


@pytest.mark.gpu
def test_bf16_kernelized_model_on_cuda_stays_as_close_to_fp32_as_unpatched(saved):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    path, batch = saved("llama"), cuda_batch("llama")
    fp32_model = load(path, use_kernels=False).cuda()
    fp32 = train_step(fp32_model, fp32_model, batch)
    # the unpatched bf16 run first: kernels before 0.19 kernelize a rotary function for the whole process
    hf_model = cuda_model(path, use_kernels=False)
    hf = train_step(hf_model, hf_model, batch)
    model = cuda_model(path, use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        assert len(hub_kernels.kernelized_layers(model)) == 7 and all(
            hub_kernels.kernelized_layers(model).values()
        )
        ours = train_step(model, model, batch)
        assert rel_diff(ours[0], fp32[0]) <= 2 * rel_diff(hf[0], fp32[0]) + 1e-3
        for name, grad in fp32[1].items():
            assert rel_diff(ours[1][name], grad) <= 2 * rel_diff(hf[1][name], grad) + 1e-2, name
    finally:
        unkernelize(model)


@pytest.mark.gpu
def test_bf16_kernelized_model_compiles_with_inductor_on_cuda(saved):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    path, batch = saved("llama"), cuda_batch("llama")
    model = cuda_model(path, use_kernels=True, kernel_config=hub_kernels.kernel_config())
    try:
        eager = train_step(model, model, batch)
        torch._dynamo.reset()
        compiled = train_step(torch.compile(model, fullgraph=True), model, batch)
        assert all(hub_kernels.kernelized_layers(model).values())
        assert rel_diff(compiled[0], eager[0]) < 1e-2
        assert max(rel_diff(compiled[1][k], eager[1][k]) for k in eager[1]) < 5e-2
    finally:
        torch._dynamo.reset()
        unkernelize(model)
