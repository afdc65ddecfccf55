"""Test configuration: on a machine without CUDA, Triton's interpreter must be on before triton is imported
(CPU runs of the kernels). With a GPU the kernels compile for it (the tests marked gpu)."""

import os

import pytest
import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(params=["torch", "triton"])
def glu_backend(request, monkeypatch):
    """The GLU tests' backend: PyTorch, or Triton (through the interpreter on CPU) with the elementwise kernels'
    block lowered to the test module's ``GLU_BLOCK`` (default 16), so small tensors span several blocks."""
    from liger_registry import kernels as K
    from liger_registry.kernels import triton_utils

    if request.param == "triton":
        if not triton_utils.INTERPRET_AT_IMPORT:
            pytest.skip("CPU runs of the Triton kernels need TRITON_INTERPRET=1 at import")
        from liger_registry.kernels.glu import triton_kernels

        monkeypatch.setattr(triton_kernels, "BLOCK", getattr(request.module, "GLU_BLOCK", 16))
    monkeypatch.setenv(K.ENV_VAR, request.param)
    return request.param
