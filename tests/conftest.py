"""Test configuration: on a machine without CUDA, Triton's interpreter must be on before triton is imported
(CPU runs of the kernels). With a GPU the kernels compile for it (tests/kernels/test_gpu.py)."""

import os

import torch  # does not import triton

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
