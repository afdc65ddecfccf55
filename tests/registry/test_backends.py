"""explain and the patch report say which backend each kernel uses for a device and dtype, and why not Triton."""

import torch

import liger_registry
from liger_registry import kernels
from liger_registry.testing import tiny_model


def test_explain_on_cpu_shows_torch_with_reasons(capsys):
    from liger_registry import cli

    assert cli.main(["explain", "llama"]) == 0
    out = capsys.readouterr().out
    assert "backends on cpu / float32:" in out
    rows = {
        line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["rms_norm"], ["forward"])
    }
    assert "torch" in rows["rms_norm"] and "cpu" in rows["rms_norm"]
    assert "fused_linear_cross_entropy" in rows["forward"]
    choices = liger_registry.explain("gpt_oss", device="cpu").backends()
    assert [(c.kernel, c.op) for c in choices] == [  # a kind's options pick its op
        ("rms_norm", "rms_norm"),
        ("rope", "rope_variant"),
        ("swiglu_clamped", "swiglu_clamped"),
        ("moe_experts", "moe_experts"),
        ("forward", "fused_linear_cross_entropy"),
    ]
    assert all(c.backend == "torch" and c.reasons for c in choices)


def test_each_installed_kernel_asks_decide_backend_with_its_op(monkeypatch):
    asked = []

    def decide(op, device, dtype):
        asked.append((op, str(device), dtype))
        return ("triton", []) if op != "rope" else ("torch", ["no reason really"])

    monkeypatch.setattr(kernels, "decide_backend", decide)
    model = tiny_model("llama", dtype=torch.bfloat16)
    with liger_registry.patched(model) as handle:
        report = str(handle.report)
    assert asked == [
        ("rms_norm", "cpu", torch.bfloat16),
        ("add_rms_norm", "cpu", torch.bfloat16),
        ("rope", "cpu", torch.bfloat16),
        ("swiglu", "cpu", torch.bfloat16),
        ("fused_linear_cross_entropy", "cpu", torch.bfloat16),
    ]
    assert "backends on cpu / bfloat16: why not triton:\n  rope (rope): no reason really" in report
    assert [c.backend for c in handle.report.backends] == ["triton", "triton", "torch", "triton", "triton"]


def test_flce_off_has_no_flce_backend():
    choices = liger_registry.explain("llama", device="cpu", fused_linear_cross_entropy=False).backends()
    assert "forward" not in [c.kernel for c in choices]
