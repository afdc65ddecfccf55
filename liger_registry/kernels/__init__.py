"""Kernels: the public functional API; each op dispatches to Triton (CUDA) or PyTorch (CPU), see ``op``."""

from __future__ import annotations

import torch

from . import torch_impl
from .ce.op import CrossEntropyOutput
from .ce.op import cross_entropy as cross_entropy
from .custom_ops import geglu_triton, layer_norm_triton, rms_norm_triton, rope_triton, swiglu_triton
from .flce.api import FLCEOutput, FusedLinearCrossEntropyFunction
from .flce.api import fused_linear_cross_entropy as fused_linear_cross_entropy
from .flce.options import FlceOptions
from .flce.planner import FlcePlan, flce_chunk_geometry, flce_plan
from .jsd.api import FusedLinearJSDFunction
from .jsd.api import fused_linear_jsd as fused_linear_jsd
from .op import (
    BACKENDS,
    ENV_VAR,
    OPS,
    BackendError,
    Op,
    backend_for,
    decide_backend,
    register,
    requested_backend,
    why_not_triton,
)


def _max_cols(limit: int = 65536):
    def check(x, *args, **kwargs):
        h = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
        return [f"last dimension {h} > {limit} not supported by the row kernel"] if h > limit else []

    return check


register(
    Op("rms_norm", torch_impl=torch_impl.rms_norm_torch, triton_impl=rms_norm_triton, extra_check=_max_cols())
)
register(
    Op(
        "layer_norm",
        torch_impl=torch_impl.layer_norm_torch,
        triton_impl=layer_norm_triton,
        extra_check=_max_cols(),
    )
)
register(Op("rope", torch_impl=torch_impl.rope_torch, triton_impl=rope_triton))
register(Op("swiglu", torch_impl=torch_impl.swiglu_torch, triton_impl=swiglu_triton))
register(Op("geglu", torch_impl=torch_impl.geglu_torch, triton_impl=geglu_triton))

# the issue-12 variants register their ops on import (rope_variant, glu_fused, swiglu_clamped, relu_squared,
# add_rms_norm), so decide_backend and explain know them
from . import add_rms_norm as _add_rms_norm  # noqa: E402, F401
from . import glu_variants as _glu_variants  # noqa: E402, F401
from . import rope_variants as _rope_variants  # noqa: E402, F401


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float = 0.0,
    casting_mode: str = "llama",
    *,
    in_place_backward: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dim; casting modes ``llama`` | ``gemma`` | ``none`` (see
    :func:`torch_impl.rms_norm_torch` for what each means and why it exists).

    ``in_place_backward=True`` lets the Triton backward overwrite the incoming gradient with dx (saves one
    activation-sized buffer). Off by default: it is only safe when nothing else reads that gradient tensor,
    and autograd may hand the same tensor to several consumers (e.g. both inputs of an ``add``)."""
    torch_impl.check_casting_mode(casting_mode)
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    op = OPS["rms_norm"]
    backend, _ = op.decide(x, weight, eps, offset, casting_mode)
    if backend == "triton":
        return op.triton_impl(x, weight, eps, offset, casting_mode, in_place_backward)
    return op.torch_impl(x, weight, eps, offset, casting_mode)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim (``F.layer_norm``)."""
    if weight.shape != (x.shape[-1],) or (bias is not None and bias.shape != (x.shape[-1],)):
        raise ValueError(f"layer_norm: weight/bias must be [{x.shape[-1]}]")
    return OPS["layer_norm"](x, weight, bias, eps)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding of q and k [batch, heads, seq, head_dim] with cos/sin [batch or 1, seq, head_dim];
    identical to HF ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``. Returns ``(q_out, k_out)``."""
    torch_impl.check_rope_shapes(q, k, cos, sin)
    return OPS["rope"](q, k, cos, sin)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    return OPS["swiglu"](gate, up)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up``."""
    if gate.shape != up.shape:
        raise ValueError(f"geglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    return OPS["geglu"](gate, up)


__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "OPS",
    "BackendError",
    "CrossEntropyOutput",
    "FLCEOutput",
    "FlceOptions",
    "FlcePlan",
    "FusedLinearCrossEntropyFunction",
    "FusedLinearJSDFunction",
    "Op",
    "backend_for",
    "cross_entropy",
    "decide_backend",
    "flce_chunk_geometry",
    "flce_plan",
    "fused_linear_cross_entropy",
    "fused_linear_jsd",
    "geglu",
    "layer_norm",
    "register",
    "requested_backend",
    "rms_norm",
    "rope",
    "swiglu",
    "why_not_triton",
]
