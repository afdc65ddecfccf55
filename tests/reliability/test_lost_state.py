"""Lost state: threads, wrappers from other libraries, dropped and copied models, custom registries, class-wide
then per-instance patches, and module functions shared by two models (issues 11 and 14)."""

from __future__ import annotations

import copy
import gc
import threading
import warnings
import weakref

import pytest
import torch
from transformers.loss import loss_utils
from transformers.models.llama import modeling_llama

import liger_registry as L
from liger_registry.testing import tiny_batch, tiny_model

pytestmark = pytest.mark.reliability("lost_state")


def transformers_state() -> dict:
    """Identity of every attribute a patch could touch: the modules' globals and their classes' own attributes."""
    state = {}
    for module in (modeling_llama, loss_utils):
        for name, value in vars(module).items():
            state[(module.__name__, name)] = id(value)
            if isinstance(value, type) and value.__module__ == module.__name__:
                state.update({(value.__qualname__, k): id(v) for k, v in vars(value).items()})
    return state


def own_forwards(model) -> dict:
    return {name: vars(m).get("forward") for name, m in model.named_modules()}


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch["input_ids"]).logits


def test_threads_apply_and_revert_leave_transformers_as_found(cases):
    before = transformers_state()
    models = [tiny_model("llama", seed=i) for i in range(6)]
    registry = L.load_registry()  # parsed once: the threads race on the record, not on YAML parsing
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def cycle(target) -> None:
        try:
            start.wait()
            for _ in range(50):
                handle = L.apply(target, registry=registry)
                handle.revert()
                L.revert(target)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=cycle, args=(m,)) for m in models]
    threads += [threading.Thread(target=cycle, args=("llama",)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cases.tried(8 * 50)
    assert errors == []
    # transformers caches some values on its classes lazily: compare what was there
    after = transformers_state()
    assert {key: after.get(key) for key in before} == before
    assert all(all(v is None for v in own_forwards(m).values()) for m in models)
    assert L.patch_handle("llama") is None and all(L.patch_handle(m) is None for m in models)


class CountingHook:
    """An accelerate ModelHook that counts the calls it sees."""

    def __new__(cls):
        from accelerate.hooks import ModelHook

        class Counting(ModelHook):
            calls = 0

            def pre_forward(self, module, *args, **kwargs):
                self.calls += 1
                return args, kwargs

        return Counting()


def training_forward(model, batch):
    model.train()
    out = model(**batch)
    model.eval()
    return out


@pytest.mark.parametrize("hook_first", [False, True], ids=["hook-after-apply", "hook-before-apply"])
def test_accelerate_hooks_keep_working_and_survive_revert(cases, hook_first):
    from accelerate.hooks import add_hook_to_module, remove_hook_from_module

    model, batch = tiny_model("llama"), None
    batch = tiny_batch(model)
    reference = logits(model, batch)
    hook = CountingHook()
    if hook_first:
        add_hook_to_module(model, hook)
    handle = L.apply(model)
    if not hook_first:
        add_hook_to_module(model, hook)
    wrapper = vars(model)["forward"]
    assert training_forward(model, batch).logits is None  # the patched forward runs under the hook
    assert hook.calls == 1
    handle.revert()
    assert vars(model)["forward"] is wrapper  # revert leaves the wrapper it did not install
    assert training_forward(model, batch).logits is not None  # and the original forward runs under it
    assert hook.calls == 2
    torch.testing.assert_close(logits(model, batch), reference, rtol=0, atol=0)
    remove_hook_from_module(model)
    assert "forward" not in vars(model) or vars(model)["forward"].__func__ is type(model).forward
    cases.tried(3)


def test_cpu_offload_after_apply_then_revert(cases):
    from accelerate import cpu_offload

    model = tiny_model("llama")
    batch = tiny_batch(model)
    reference = logits(model, batch)
    handle = L.apply(model)
    cpu_offload(model, execution_device=torch.device("cpu"))
    assert training_forward(model, batch).logits is None
    handle.revert()
    torch.testing.assert_close(logits(model, batch), reference, rtol=0, atol=0)
    assert training_forward(model, batch).logits is not None
    cases.tried(2)


def test_accelerator_mixed_precision_after_apply_then_revert(cases):
    from accelerate import Accelerator

    model = tiny_model("llama")
    batch = tiny_batch(model)
    handle = L.apply(model)
    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    model = accelerator.prepare(model)
    wrapper = vars(model)["forward"]
    assert training_forward(model, batch).logits is None  # patched, under accelerate's autocast wrapper
    with pytest.warns(UserWarning, match="replaced after apply"):
        handle.revert()
    assert vars(model)["forward"] is wrapper
    out = training_forward(model, batch)
    assert out.logits is not None and torch.isfinite(out.loss)
    cases.tried(2)


def test_a_dropped_patched_model_is_collected(cases):
    model = tiny_model("llama")
    L.apply(model)
    dead = weakref.ref(model)
    del model
    gc.collect()
    assert dead() is None
    model = tiny_model("llama")
    handle = L.apply(model)  # the caller keeps the handle, not the model
    dead = weakref.ref(model)
    del model
    gc.collect()
    assert dead() is None
    handle.revert()  # nothing left to restore: a no-op
    assert not handle.active
    cases.tried(2)


def test_a_deep_copy_of_a_patched_model_is_unpatched(cases):
    """Decided: a deep copy is not patched. It computes as the unpatched model, has no handle, and can be
    patched on its own; the source stays patched."""
    model = tiny_model("llama")
    batch = tiny_batch(model)
    reference = logits(model, batch)
    handle = L.apply(model)
    twin = copy.deepcopy(model)
    assert L.patch_handle(twin) is None and L.revert(twin) is False
    assert training_forward(twin, batch).logits is not None
    torch.testing.assert_close(logits(twin, batch), reference, rtol=0, atol=0)
    assert training_forward(model, batch).logits is None
    with L.patched(twin):
        assert training_forward(twin, batch).logits is None
    assert all(v is None for v in own_forwards(twin).values())
    handle.revert()
    cases.tried(3)


def test_revert_and_handle_by_name_after_a_custom_registry(cases, tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "family: mine\nmodel_types: [mine_llama]\nmodule: transformers.models.llama.modeling_llama\n"
        "causal_lm: LlamaForCausalLM\nkernels:\n  rms_norm: {targets: [LlamaRMSNorm]}\n"
    )
    registry = L.load_registry(tmp_path)
    norm = modeling_llama.LlamaRMSNorm.forward
    handle = L.apply("mine_llama", registry=registry)
    assert L.patch_handle("mine") is handle and L.patch_handle("mine_llama") is handle
    assert L.revert("mine_llama") is True
    assert modeling_llama.LlamaRMSNorm.forward is norm
    handle = L.apply("mllama_text_model")
    try:
        assert L.patch_handle("mllama_text_model") is handle
        assert L.patch_handle(handle.report.family) is handle
    finally:
        assert L.revert("mllama_text_model") is True
    assert L.patch_handle("mllama_text_model") is None
    cases.tried(4)


def test_class_wide_then_instance_apply(cases):
    before = transformers_state()
    model = tiny_model("llama")
    batch = tiny_batch(model)
    model.train()
    reference = model(**batch).loss
    family = L.apply("llama")
    instance = L.apply(model, chunk_mem_const=2)
    torch.testing.assert_close(model(**batch).loss, reference, rtol=1e-5, atol=1e-6)
    assert "skip_logits" in str(__import__("inspect").signature(model.forward))
    instance.revert()
    assert model(**batch).logits is None  # still patched class-wide
    family.revert()
    assert model(**batch).logits is not None
    after = transformers_state()
    assert {key: after.get(key) for key in before} == before
    cases.tried(2)


def test_trainer_callback_after_a_class_wide_apply(cases):
    from liger_registry.integrations.trainer import LigerRegistryCallback

    model = tiny_model("llama")
    family = L.apply("llama")
    callback = LigerRegistryCallback()
    try:
        handle = callback.patch(model)
        assert handle is not None and handle.active
        callback.revert()
    finally:
        family.revert()
    assert all(v is None for v in own_forwards(model).values())
    cases.tried(1)


def test_a_second_unpatched_model_is_untouched(cases, monkeypatch):
    """The reference model of DPO (or a distillation teacher) keeps its own RoPE while the policy model
    is patched: its logits are bitwise those of a never-patched copy."""
    from liger_registry import kernels

    reference_model = tiny_model("llama", seed=1)
    policy = tiny_model("llama", seed=2)
    batch = tiny_batch(reference_model)
    never_patched = logits(reference_model, batch)
    policy_before = logits(policy, batch)
    calls = []
    rope = kernels.rope
    monkeypatch.setattr(kernels, "rope", lambda *a, **k: calls.append(1) or rope(*a, **k))
    with L.patched(policy):
        assert torch.equal(logits(reference_model, batch), never_patched)
        assert not calls
        torch.testing.assert_close(logits(policy, batch), policy_before, rtol=1e-5, atol=1e-5)
        assert len(calls) == policy.config.num_hidden_layers  # the policy's attentions run the kernel
        assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__
    cases.tried(2)


def test_revert_leaves_a_function_someone_else_replaced(cases):
    original = modeling_llama.apply_rotary_pos_emb

    def theirs(*args, **kwargs):
        return original(*args, **kwargs)

    handle = L.apply("llama")
    modeling_llama.apply_rotary_pos_emb = theirs
    try:
        with pytest.warns(UserWarning, match="replaced after apply"):
            handle.revert()
        assert modeling_llama.apply_rotary_pos_emb is theirs
    finally:
        modeling_llama.apply_rotary_pos_emb = original
    cases.tried(1)


def test_revert_leaves_a_forward_someone_else_replaced(cases):
    model = tiny_model("llama")
    handle = L.apply(model)

    def theirs(*args, **kwargs):
        return "theirs"

    model.forward = theirs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle.revert()
    assert any("replaced after apply" in str(w.message) for w in caught)
    assert model.forward is theirs
    cases.tried(1)
