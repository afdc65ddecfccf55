"""Backend selection: device rule, LIGER_REGISTRY_BACKEND read at call time, refusals that say why."""

import pytest
import torch

from liger_registry import kernels as K


def test_auto_on_cpu_is_torch(monkeypatch):
    monkeypatch.delenv(K.ENV_VAR, raising=False)
    x = torch.randn(2, 8)
    assert K.backend_for(x) == "torch"
    assert K.backend_for(x, op="rms_norm") == "torch"
    assert "tensor on cpu and backend is auto" in K.why_not_triton("rms_norm", x, torch.ones(8), 1e-6)


def test_env_read_at_call_time(monkeypatch):
    x = torch.randn(2, 8)
    monkeypatch.setenv(K.ENV_VAR, "torch")
    assert K.backend_for(x) == "torch"
    monkeypatch.setenv(K.ENV_VAR, "triton")
    assert K.backend_for(x) == "triton"
    monkeypatch.setenv(K.ENV_VAR, "TORCH")
    assert K.backend_for(x) == "torch"


def test_bad_env_value_is_clear(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="LIGER_REGISTRY_BACKEND='cuda'.*auto, triton, torch"):
        K.rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6)


def test_forced_triton_refuses_float64_with_reason(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    x = torch.randn(2, 8, dtype=torch.float64)
    with pytest.raises(K.BackendError, match="dtype float64 not supported"):
        K.rms_norm(x, torch.ones(8, dtype=torch.float64), 1e-6)
    assert "dtype float64 not supported" in K.why_not_triton("swiglu", x, x)


def test_every_public_op_is_registered():
    for name in ("fused_linear_cross_entropy", "fused_linear_jsd", "cross_entropy", "rms_norm", "layer_norm", "rope", "swiglu", "geglu"):
        assert name in K.OPS and callable(getattr(K, name))
