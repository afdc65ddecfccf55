"""Inductor compile of every bundled family's patched tiny model with the Triton backend forced (the interpreter on
CPU): one training step's loss and gradients against the same model eager.

A fixed subset covers every kind of kernel (llama: RMSNorm, RoPE, SwiGLU, add + RMSNorm; gpt_oss: MoE experts'
clamped SwiGLU, half-split RoPE; gemma2: final-logit softcap, GeGLU, gemma casting; nemotron: LayerNorm1P,
partial RoPE, relu²; phi3: fused gate_up). ``LIGER_REGISTRY_COMPILE_ALL=1`` runs every family (the GPU run does
so on every family, ``python -m benchmarks compile``).
"""

from __future__ import annotations

import os

import pytest
import torch

from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.registry.loader import load_registry
from liger_registry.testing import CompileCheck, compile_check

FIXED = ("llama", "gpt_oss", "gemma2", "nemotron", "phi3")
ALL_ENV = "LIGER_REGISTRY_COMPILE_ALL"
# fp32 on both sides: what differs is the order inductor fuses the same arithmetic in
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4


def _families() -> list[str]:
    if os.environ.get(ALL_ENV) == "1":
        return sorted(load_registry().families)
    return list(FIXED)


def _model_type(family: str) -> str:
    return load_registry().family(family).entry.model_types[0]


@pytest.mark.skipif(
    not (torch.cuda.is_available() or triton_utils.INTERPRET_AT_IMPORT),
    reason="Triton on CPU tensors needs TRITON_INTERPRET=1 at import",
)
@pytest.mark.parametrize("family", _families())
def test_inductor_compile_with_triton_matches_eager(family, monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check = compile_check(_model_type(family), device=device, tolerances=(LOSS_TOL, GRAD_TOL))
    print(f"\n{family}: loss {check.loss_rel:.1e} grads {check.grad_rel:.1e} compile {check.compile_s:.1f} s")
    assert check.error is None, check.error
    assert check.ok(LOSS_TOL, GRAD_TOL), check


def test_a_compiled_step_off_eager_passes_only_as_the_unpatched_compiled_one():
    """paligemma's unpatched model itself compiles to a step off eager (inductor, transformers 5.x): the patched
    compiled step is then judged against the unpatched compiled one, never waved through."""
    off = CompileCheck("f", loss_rel=2e-4, grad_rel=1.5)
    assert not off.ok(LOSS_TOL, GRAD_TOL) and not off.as_unpatched
    alike = CompileCheck(
        "f", loss_rel=2e-4, grad_rel=1.5, vs_unpatched_loss_rel=1e-7, vs_unpatched_grad_rel=2e-7
    )
    assert alike.ok(LOSS_TOL, GRAD_TOL) and alike.as_unpatched
    unlike = CompileCheck(
        "f", loss_rel=2e-4, grad_rel=1.5, vs_unpatched_loss_rel=1e-7, vs_unpatched_grad_rel=0.3
    )
    assert not unlike.ok(LOSS_TOL, GRAD_TOL)
    assert not CompileCheck("f", loss_rel=0.0, grad_rel=0.0, error="boom").ok(LOSS_TOL, GRAD_TOL)


def _stub_steps(monkeypatch, *steps):
    """compile_check's steps (patched eager, patched compiled, unpatched compiled) as given; no compile runs."""
    from liger_registry import testing

    queue = list(steps)
    monkeypatch.setattr(testing, "loss_and_grads", lambda *a: queue.pop(0))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)


def _grads(*names):
    return {n: torch.ones(3) for n in names}


@pytest.mark.parametrize(
    ("unpatched_compiled", "passes"),
    [(_grads("a"), True), (_grads("a", "indexer"), False)],
    ids=["unpatched-compiled-alike", "unpatched-compiled-unlike"],
)
def test_a_compiled_step_without_some_gradients_passes_only_as_the_unpatched_compiled_one(
    monkeypatch, unpatched_compiled, passes
):
    """DeepSeek-V4's indexer has gradients eagerly and none compiled, patched or not: judged against the
    unpatched compiled step, which must have the same parameters' gradients, close."""
    loss = torch.tensor(1.0)
    _stub_steps(monkeypatch, (loss, _grads("a", "indexer")), (loss, _grads("a")), (loss, unpatched_compiled))
    check = compile_check("llama", tolerances=(LOSS_TOL, GRAD_TOL))
    assert check.ok(LOSS_TOL, GRAD_TOL) is passes
    if not passes:
        assert check.error == "gradients of different parameters: ['indexer']"
