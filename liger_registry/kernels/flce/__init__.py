"""Fused linear cross entropy: the loss of ``hidden @ W.T`` without materialising the logits.

* ``op``: :func:`fused_linear_cross_entropy`, its autograd Function and custom ops.
* ``options``: :class:`FlceOptions` and the flattened run of a call (``FlceRun``).
* ``plan``: chunk geometries, cost model and the plan of a call (:func:`flce_plan`).
* ``tokens`` / ``vocab``: the two strategies' chunk loops; ``target``: the exact fp32 target logit.
* ``reference``: the PyTorch row math of the vocabulary strategy; ``triton_kernels``: its Triton kernels.
"""

from .op import FLCEOutput, FusedLinearCrossEntropyFunction, fused_linear_cross_entropy
from .options import FlceOptions
from .plan import FlcePlan, flce_chunk_geometry, flce_plan

__all__ = [
    "FLCEOutput",
    "FlceOptions",
    "FlcePlan",
    "FusedLinearCrossEntropyFunction",
    "flce_chunk_geometry",
    "flce_plan",
    "fused_linear_cross_entropy",
]
