"""Out-of-range or wrongly typed labels: a ValueError naming the bad ids from FLCE and cross_entropy, on both
strategies and both backends (Triton through the interpreter on CPU), never a plausible loss."""

from __future__ import annotations

import pytest
import torch

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.flce import plan as flce_plan

V, H, N = 24, 8, 10
# on a CUDA machine (the H200 run) the same cases run on the GPU: Triton compiled, labels checked on the device
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch"] + (["triton"] if triton_utils.INTERPRET_AT_IMPORT or torch.cuda.is_available() else [])
STRATEGIES = ["tokens", "vocab"]
# (bad label, ignore_index): out of range above, negative but not the ignore value, a custom ignore value
BAD = [(V, -100), (V + 1000, -100), (-1, -100), (-7, -100), (-100, -1), (2**40, -100)]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, request.param)
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)
    monkeypatch.setattr(flce_plan, "VOCAB_ALIGN", 8)
    return request.param


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).to(DEVICE).requires_grad_()
    weight = torch.randn(V, H, generator=g).to(DEVICE).requires_grad_()
    target = torch.randint(0, V, (N,), generator=g)
    target[3] = -100
    return hidden, weight, target.to(DEVICE)


@pytest.mark.reliability("silent_wrong")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flce_refuses_out_of_range_labels(backend, strategy, cases) -> None:
    for bad, ignore_index in BAD:
        hidden, weight, target = _inputs()
        target[5] = bad
        cases.tried()
        with pytest.raises(ValueError, match=rf"out of range: (.*, )?{bad}(,|;)"):
            K.fused_linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index, strategy=strategy)


@pytest.mark.reliability("silent_wrong")
def test_cross_entropy_refuses_out_of_range_labels(backend, cases) -> None:
    for bad, ignore_index in BAD:
        _, _, target = _inputs()
        logits = torch.randn(N, V, device=DEVICE, requires_grad=True)
        target[5] = bad
        cases.tried()
        with pytest.raises(ValueError, match=rf"out of range: (.*, )?{bad}(,|;)"):
            K.cross_entropy(logits, target, ignore_index=ignore_index)


@pytest.mark.reliability("silent_wrong")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int16, torch.uint8])
def test_wrong_label_dtype_is_refused(backend, dtype, cases) -> None:
    hidden, weight, target = _inputs()
    target = target.clamp(min=0).to(dtype)
    cases.tried(2)
    with pytest.raises(ValueError, match=f"target.*{str(dtype).removeprefix('torch.')}"):
        K.fused_linear_cross_entropy(hidden, weight, target)
    with pytest.raises(ValueError, match=f"target.*{str(dtype).removeprefix('torch.')}"):
        K.cross_entropy(hidden @ weight.t(), target)


@pytest.mark.reliability("silent_wrong")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_valid_labels_still_match_the_reference(backend, strategy, cases) -> None:
    hidden, weight, target = _inputs()
    ref = torch.nn.functional.cross_entropy(hidden @ weight.t(), target)
    for dtype in (torch.int64, torch.int32):
        cases.tried()
        got = K.fused_linear_cross_entropy(hidden, weight, target.to(dtype), strategy=strategy)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(K.cross_entropy(hidden @ weight.t(), target.to(dtype)), ref)


@pytest.mark.reliability("silent_wrong")
def test_same_message_on_both_backends(monkeypatch, cases) -> None:
    messages = set()
    for backend in BACKENDS:
        monkeypatch.setenv(K.ENV_VAR, backend)
        hidden, weight, target = _inputs()
        target[[1, 2]] = torch.tensor([V + 3, -5], device=DEVICE)
        for fn, first in ((K.fused_linear_cross_entropy, hidden), (K.cross_entropy, hidden @ weight.t())):
            cases.tried()
            with pytest.raises(ValueError) as info:
                fn(first, weight, target) if fn is K.fused_linear_cross_entropy else fn(first, target)
            messages.add(str(info.value))
    assert len(messages) == 1, messages


@pytest.mark.reliability("silent_wrong")
def test_patched_model_refuses_out_of_range_labels(cases) -> None:
    import liger_registry as L
    from liger_registry.testing import tiny_batch, tiny_model

    model = tiny_model("llama")
    batch = tiny_batch(model)
    vocab = model.config.vocab_size
    model.train()
    with L.patched(model):
        for bad in (vocab, vocab + 17, -3):
            labels = batch["labels"].clone()
            labels[0, 5] = bad
            cases.tried()
            with pytest.raises(ValueError, match=f"out of range: {bad}"):
                model(**{**batch, "labels": labels})
        cases.tried()
        labels = batch["labels"].clone()
        labels[0, 5] = -100
        assert torch.isfinite(model(**{**batch, "labels": labels}).loss)


@pytest.mark.reliability("silent_wrong")
def test_a_model_on_the_meta_device_runs_patched_as_unpatched(cases) -> None:
    """Meta tensors have no values to check (shape inference, memory planning): the patched forward with labels
    runs there as the unpatched one does, loss shape and all."""
    from transformers import AutoModelForCausalLM

    import liger_registry as L
    from liger_registry.testing import tiny_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    unpatched = model(input_ids=ids, labels=ids).loss
    with L.patched(model):
        patched = model(input_ids=ids, labels=ids).loss
    assert patched.is_meta and (patched.shape, patched.dtype) == (unpatched.shape, unpatched.dtype)
    cases.tried()
