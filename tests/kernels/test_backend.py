"""Backend selection: device rule, LIGER_REGISTRY_BACKEND read at call time, refusals that say why."""

import pytest
import torch
from cases import gpu

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
    for name in (
        "fused_linear_cross_entropy",
        "fused_linear_jsd",
        "fused_linear_logprobs",
        "cross_entropy",
        "rms_norm",
        "layer_norm",
        "rope",
        "swiglu",
        "geglu",
    ):
        assert name in K.OPS and callable(getattr(K, name))


def test_decide_returns_backend_and_reasons(monkeypatch):
    monkeypatch.delenv(K.ENV_VAR, raising=False)
    x = torch.randn(2, 8)
    assert K.OPS["swiglu"].decide(x, x) == ("torch", ["tensor on cpu and backend is auto"])
    backend, reasons = K.OPS["swiglu"].decide(x.double(), x.double())
    assert backend == "torch" and "dtype float64 not supported" in reasons
    monkeypatch.setenv(K.ENV_VAR, "torch")
    assert K.OPS["swiglu"].decide(x, x) == ("torch", ["LIGER_REGISTRY_BACKEND=torch"])


def test_decide_backend_without_tensors(monkeypatch):
    monkeypatch.delenv(K.ENV_VAR, raising=False)
    names = (
        "rms_norm",
        "layer_norm",
        "rope",
        "swiglu",
        "geglu",
        "cross_entropy",
        "fused_linear_cross_entropy",
        "fused_linear_jsd",
        "rope_variant",
        "glu_fused",
        "swiglu_clamped",
        "relu_squared",
        "add_rms_norm",
    )
    for name in names:
        assert K.decide_backend(name, "cuda", torch.bfloat16) == ("triton", [])
        assert K.decide_backend(name, "cpu", torch.float32) == (
            "torch",
            ["tensor on cpu and backend is auto"],
        )
    backend, reasons = K.decide_backend("rms_norm", torch.device("cuda", 0), torch.float64)
    assert backend == "torch" and reasons == ["dtype float64 not supported"]
    monkeypatch.setenv(K.ENV_VAR, "triton")
    with pytest.raises(K.BackendError, match="rms_norm cannot run on Triton: dtype float64 not supported"):
        K.decide_backend("rms_norm", "cuda", torch.float64)
    with pytest.raises(KeyError, match="unknown op"):
        K.decide_backend("rmsnorm", "cuda", torch.float32)


def test_decide_agrees_with_the_reasons(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "auto")
    for args in [(torch.randn(2, 8), torch.ones(8), 1e-6), (torch.randn(2, 70000), torch.ones(70000), 1e-6)]:
        backend, reasons = K.OPS["rms_norm"].decide(*args)
        assert reasons == K.why_not_triton("rms_norm", *args)
        assert (backend == "triton") == (not reasons)


def test_forced_triton_flce_refuses_float64_with_every_reason(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "triton")
    h = torch.randn(3, 4, dtype=torch.float64)
    w = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(
        K.BackendError, match="fused_linear_cross_entropy cannot run on Triton: dtype float64"
    ):
        K.fused_linear_cross_entropy(h, w, torch.zeros(3, dtype=torch.long))
    with pytest.raises(K.BackendError, match="fused_linear_jsd cannot run on Triton: dtype float64"):
        K.fused_linear_jsd(h, w, h, w)


@gpu
def test_auto_backend_is_triton_on_cuda(monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, "auto")
    x = torch.randn(4, 8, device="cuda")
    assert K.backend_for(x, op="rms_norm") == "triton"
    assert K.backend_for(x.double(), op="rms_norm") == "torch"


@gpu
@pytest.mark.usefixtures("auto_backend")
def test_variants_run_triton_on_cuda():
    x = torch.randn(4, 8, device="cuda", dtype=torch.bfloat16)
    ops = ("rope_variant", "glu_fused", "swiglu_clamped", "relu_squared", "add_rms_norm")
    assert all(K.OPS[op].decide(x)[0] == "triton" for op in ops)


def test_decision_is_cached_per_device_dtype_and_setting(monkeypatch):
    """The rule's walk over the reasons runs once per (op, setting, devices and dtypes); a hot call only looks
    it up, and a changed setting or dtype is a new key (not a stale answer)."""
    from liger_registry.kernels import backend

    walks = []
    real = backend.tensor_reasons
    monkeypatch.setattr(backend, "tensor_reasons", lambda *a: walks.append(1) or real(*a))
    backend.clear_decisions()
    monkeypatch.setenv(K.ENV_VAR, "auto")
    x = torch.randn(2, 8)
    for _ in range(3):
        assert K.OPS["swiglu"].decide(x, x) == ("torch", ["tensor on cpu and backend is auto"])
    assert len(walks) == 1
    assert "dtype float64 not supported" in K.OPS["swiglu"].decide(x.double(), x.double())[1]
    assert len(walks) == 2
    monkeypatch.setenv(K.ENV_VAR, "torch")
    assert K.OPS["swiglu"].decide(x, x) == ("torch", ["LIGER_REGISTRY_BACKEND=torch"])
    monkeypatch.setenv(K.ENV_VAR, "triton")
    with pytest.raises(K.BackendError, match="float64"):  # a cached refusal still raises, every time
        K.OPS["swiglu"].decide(x.double(), x.double())
    with pytest.raises(K.BackendError, match="float64"):
        K.OPS["swiglu"].decide(x.double(), x.double())
    backend.clear_decisions()


def test_cached_decision_still_applies_the_shape_check(monkeypatch):
    """The op's shape check is not part of the key: a wide row after a narrow one on the same device and dtype
    is still refused."""
    from liger_registry.kernels import backend

    monkeypatch.setenv(K.ENV_VAR, "auto")
    spec = backend.TensorSpec(torch.device("cuda"), torch.float32)
    op = K.OPS["rms_norm"]
    narrow, wide = torch.empty(2, 8, device="meta"), torch.empty(2, 70000, device="meta")
    assert op._decide([spec], (narrow,), {}) == ("triton", [])
    backend_, reasons = op._decide([spec], (wide,), {})
    assert backend_ == "torch" and reasons == ["last dimension 70000 > 65536 not supported by the row kernel"]
