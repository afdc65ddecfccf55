"""The CPU host-time probe of the norm calls: it runs every case with the launchers stubbed and the Triton backend
forced, and puts back the launchers and the environment variable afterwards."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.probes import norm_host_cpu as probe
from liger_registry import kernels as K
from liger_registry.kernels.norm import triton_kernels as tk

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="forcing Triton on CPU needs the interpreter"
)


def test_probe_times_every_case_and_restores_the_launchers(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "auto")
    before = (tk.launch_rms_norm_fwd, tk.launch_rms_norm_bwd, tk.launch_add_rms_norm_fwd)
    us = probe.measure(calls=3, rounds=1)
    assert set(us) >= {"rms_norm fwd+bwd", "LlamaRMSNorm patched fwd+bwd", "custom op fwd (dispatcher)"}
    assert all(v > 0 for v in us.values())
    assert (tk.launch_rms_norm_fwd, tk.launch_rms_norm_bwd, tk.launch_add_rms_norm_fwd) == before
    assert os.environ[K.ENV_VAR] == "auto"


def test_stubbed_calls_take_the_triton_path(monkeypatch):
    """The cases time the Triton path: with the stubs in place a forced-Triton call returns the stub's output
    (uninitialised memory, not the reference's values) and its backward reaches the stubbed launcher."""
    monkeypatch.setenv(K.ENV_VAR, "triton")
    saved, _ = probe._stub_launchers()
    calls = []
    stub_bwd = tk.launch_rms_norm_bwd
    tk.launch_rms_norm_bwd = lambda *a, **k: calls.append(1) or stub_bwd(*a, **k)
    try:
        x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
        K.rms_norm(x, w, 1e-6).backward(torch.ones(4, 8))
    finally:
        for name, fn in saved.items():
            setattr(tk, name, fn)
    assert calls == [1] and x.grad is not None and w.grad is not None
    assert tk.launch_rms_norm_bwd is saved["launch_rms_norm_bwd"]
