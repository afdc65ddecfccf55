"""Test configuration: Triton's interpreter must be on before triton is imported (CPU runs of the kernels)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
