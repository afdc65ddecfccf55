"""Fixtures of the per-op kernel tests: the backend axis (PyTorch, or Triton through the interpreter on CPU) and
the CUDA tests' summary table (written as JSON to $GPU_TEST_REPORT when set)."""

from __future__ import annotations

import pytest
from cases import (
    BACKENDS,
    INTERPRETER,
    NO_INTERPRETER,
    ROWS,
    flce_plan,
    report_table,
    triton_utils,
    write_report,
)

from liger_registry import kernels as K


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _gpu_report():
    yield
    if ROWS:
        print("\n" + report_table())
        write_report()


@pytest.fixture
def triton_small(monkeypatch):
    """Triton through the interpreter with the blocks lowered: tiny rows still cross column blocks, and a small
    vocabulary splits into several chunks."""
    if not INTERPRETER:
        pytest.skip(NO_INTERPRETER)
    monkeypatch.setenv(K.ENV_VAR, "triton")
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)
    monkeypatch.setattr(flce_plan, "VOCAB_ALIGN", 8)
    return "triton"


@pytest.fixture
def auto_backend(monkeypatch):
    """The default dispatch (CUDA tensors run Triton), whatever the environment forces."""
    monkeypatch.setenv(K.ENV_VAR, "auto")
