"""Fused linear generalised Jensen-Shannon divergence (distillation), chunked over tokens.

* ``op``: :func:`fused_linear_jsd`, its autograd Function, the token loop and its custom op.
* ``reference``: the PyTorch row formulas; ``triton_kernels``: the Triton rows kernel.
"""

from .op import FusedLinearJSDFunction, fused_linear_jsd

__all__ = ["FusedLinearJSDFunction", "fused_linear_jsd"]
