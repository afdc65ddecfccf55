"""MoE experts: the public ``moe_experts``, a transformers experts module's forward as grouped GEMMs.

* :func:`moe_experts` ``(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, ...)``: what the
  forward of a transformers experts module (``use_experts_implementation``) returns, for stacked weights
  ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I] (``transposed``: [E, H, 2I] and [E, I, H]), optional
  biases [E, 2I] and [E, H], and the gate ``act``: ``swiglu`` / ``geglu`` over a ``[gate | up]`` split, or
  ``clamped_swiglu`` (GPT-OSS: interleaved pairs, ``limit``, ``alpha``), or ``limited_swiglu`` (DeepSeek-V4:
  the split SwiGLU with gate and up clamped at ``limit``).
* ``up_proj``: separate up weights (DBRX's ``v1`` beside ``w1``): ``gate_up_proj`` then holds only the gate's
  [E, I, H] (transposed [E, H, I]) and ``up_proj`` the up's, same shape and strides, both read in place (split
  gates only). Any weight may be a strided view (DBRX's down weight, stored [E, I, H], passes as
  ``w2.transpose(1, 2)``).
* Bad arguments raise one ``ValueError`` naming every problem; the routing table (``routing``) is built once per
  call, the op (``op``) runs forward and backward as grouped GEMMs (``triton_kernels``) or the per-expert loop
  (``reference``).
"""

from __future__ import annotations

import torch

from .op import MOE_EXPERTS
from .routing import route

ACTS = ("swiglu", "geglu", "clamped_swiglu", "limited_swiglu")
# the [gate | up] gates: those separate up weights can feed
SPLIT_ACTS = ("swiglu", "geglu", "limited_swiglu")


def _up_problems(w_gu, w_up, act: str) -> list[str]:
    if w_up is None:
        return []
    problems = []
    if act not in SPLIT_ACTS:
        problems.append(f"up_proj given with act={act!r}; it takes {', '.join(SPLIT_ACTS)}")
    if w_up.shape != w_gu.shape or w_up.stride() != w_gu.stride():
        problems.append(
            f"up_proj {tuple(w_up.shape)} strides {w_up.stride()} must match gate_up_proj {tuple(w_gu.shape)} "
            f"strides {w_gu.stride()}"
        )
    return problems


def _problems(x, idx, w, w_gu, w_d, b_gu, b_d, w_up, act: str, transposed: bool) -> list[str]:
    problems = []
    if act not in ACTS:
        problems.append(f"act={act!r}; expected one of {', '.join(ACTS)}")
    problems += _up_problems(w_gu, w_up, act)
    if x.dim() != 2 or idx.dim() != 2 or w.shape != idx.shape or idx.shape[0] != x.shape[0]:
        problems.append(
            f"hidden_states [T, H], top_k_index and top_k_weights [T, K] expected; got {tuple(x.shape)}, "
            f"{tuple(idx.shape)}, {tuple(w.shape)}"
        )
    if idx.dtype.is_floating_point:
        problems.append(f"top_k_index must hold integers, got {idx.dtype}")
    if w_gu.dim() != 3 or w_d.dim() != 3 or w_gu.shape[0] != w_d.shape[0]:
        return [
            *problems,
            f"stacked 3-D expert weights expected; got {tuple(w_gu.shape)}, {tuple(w_d.shape)}",
        ]
    e, h = w_gu.shape[0], x.shape[-1]
    gu, d = ((e, h, None), (e, None, h)) if transposed else ((e, None, h), (e, h, None))
    rows = w_gu.shape[2] if transposed else w_gu.shape[1]
    inter2 = 2 * rows if w_up is not None else rows
    want_gu = tuple(rows if v is None else v for v in gu)
    want_d = tuple(inter2 // 2 if v is None else v for v in d)
    if inter2 % 2 or tuple(w_gu.shape) != want_gu or tuple(w_d.shape) != want_d:
        problems.append(
            f"gate_up_proj {tuple(w_gu.shape)} and down_proj {tuple(w_d.shape)} do not fit hidden {h}"
            f"{' (transposed layout)' if transposed else ''}{' (separate up_proj)' if w_up is not None else ''}"
        )
    for name, b, n in (("gate_up_bias", b_gu, inter2), ("down_bias", b_d, h)):
        if b is not None and tuple(b.shape) != (e, n):
            problems.append(f"{name} {tuple(b.shape)}; expected {(e, n)}")
    dtypes = {t.dtype for t in (x, w_gu, w_d, b_gu, b_d, w_up) if t is not None}
    if len(dtypes) > 1:
        problems.append(
            f"hidden_states and expert weights must share a dtype, got {sorted(map(str, dtypes))}"
        )
    return problems


def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    *,
    act: str = "swiglu",
    limit: float = 0.0,
    alpha: float = 0.0,
    transposed: bool = False,
    up_proj: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_k w[t, k] * down_e(gate(gate_up_e(x[t])))`` with ``e = top_k_index[t, k]``: [T, H] for
    hidden_states [T, H]. Every expert id must be in ``[0, E)``. With ``up_proj``, ``gate_up_e`` is the gate's and
    the up's projections side by side (``gate_up_bias`` stays [E, 2I])."""
    args = (hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, gate_up_bias, down_bias)
    if problems := _problems(*args, up_proj, act, transposed):
        raise ValueError("moe_experts: " + "; ".join(problems))
    table = route(top_k_index, gate_up_proj.shape[0])
    weights = top_k_weights.reshape(-1)[table.dest.long()]
    return MOE_EXPERTS(
        hidden_states, weights, gate_up_proj, down_proj, gate_up_bias, down_bias, up_proj, table,
        top_k_index.shape[-1], act, limit, alpha, not transposed,
    )  # fmt: skip


__all__ = ["ACTS", "SPLIT_ACTS", "moe_experts"]
