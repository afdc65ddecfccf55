"""Cross entropy over rows of logits [N, V], forward and gradient in one pass.

* ``op``: :func:`cross_entropy`, :class:`CrossEntropyOutput` and the custom ops of the fused path.
* ``reference``: the PyTorch row math (the CPU path and the reference of the kernels).
* ``triton_kernels``: the row statistics / gradient passes CE and FLCE share, and CE's rows kernel.
* ``labels``: the label check every loss runs before a kernel reads its labels.
"""

from .op import CrossEntropyOutput, cross_entropy

__all__ = ["CrossEntropyOutput", "cross_entropy"]
