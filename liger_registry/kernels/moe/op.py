"""The MoE experts op, defined once with ``define_op``, and its registered backend Op.

* Custom ops ``moe_experts`` / ``moe_experts_bwd`` (``experts_fwd`` / ``experts_bwd`` here) over the sorted rows
  of a :class:`~.routing.Route`: the Triton grouped GEMMs or the PyTorch per-expert loop (``reference``).
* Forward outputs: the experts' result [T, H] and, for the backward, the gate/up projection [S, 2I] and the
  gated activation [S, I] of each sorted row (the activation is recomputed from gate/up where the backward needs
  its value, never stored twice). The routing weights enter sorted by row (a differentiable gather outside the
  op).
* ``w_up``: the up weights when ``w_gu`` holds only the gate's (DBRX's ``v1`` beside ``w1``), read in place; its
  gradient is the backward's last output (empty when there is none, as the bias gradients are).
* ``MOE_EXPERTS``: the registered backend Op. Tuning and measurements: docs/design/moe-experts.md.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..backend import Op, register
from ..define import define_op
from . import reference as ref
from . import triton_kernels as tk
from .routing import Route


def _inter(w_gu: Tensor, w_up: Tensor | None, out_first: bool) -> int:
    rows = w_gu.shape[1] if out_first else w_gu.shape[2]
    return rows if w_up is not None else rows // 2


def _fwd_triton(x, weights, w_gu, w_d, b_gu, b_d, w_up, route: Route, top_k, act, limit, alpha, out_first):
    n_rows, hidden, inter = route.src.shape[0], x.shape[1], _inter(w_gu, w_up, out_first)
    gate_up = x.new_empty(n_rows, 2 * inter)
    h = x.new_empty(n_rows, inter)
    glu = dict(act=act, limit=limit, alpha=alpha)
    tk.rows_gemm(tk.GLU_FWD, x, route.src, w_gu, out_first, inter, route, out=gate_up, out2=h, w_up=w_up,
                 bias=b_gu, **glu)  # fmt: skip
    buf = torch.empty(n_rows, hidden, dtype=torch.promote_types(x.dtype, weights.dtype), device=x.device)
    tk.rows_gemm(
        tk.SCATTER_WEIGHTED, h, None, w_d, out_first, hidden, route, out=buf, bias=b_d, weights=weights
    )
    return buf.view(-1, top_k, hidden).sum(1).to(x.dtype), gate_up, h


def _fwd_impl(
    x: Tensor, weights: Tensor, w_gu: Tensor, w_d: Tensor, b_gu: Tensor | None, b_d: Tensor | None,
    w_up: Tensor | None, src: Tensor, dest: Tensor, offsets: Tensor, blocks: Tensor, block_m: int, top_k: int,
    act: str, limit: float, alpha: float, out_first: bool, backend: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    if backend == "torch":
        return ref.experts_fwd_torch(x, weights, w_gu, w_d, b_gu, b_d, w_up, src, dest, offsets, top_k, act, limit,
                              alpha, out_first)  # fmt: skip
    route = Route(src, dest, offsets, blocks, block_m)
    return _fwd_triton(x, weights, w_gu, w_d, b_gu, b_d, w_up, route, top_k, act, limit, alpha, out_first)


def _fwd_fake(x, weights, w_gu, w_d, b_gu, b_d, w_up, src, dest, offsets, blocks, block_m, top_k, act, limit,
              alpha, out_first, backend):  # fmt: skip
    inter = _inter(w_gu, w_up, out_first)
    n_rows = src.shape[0]
    return x.new_empty(x.shape), x.new_empty(n_rows, 2 * inter), x.new_empty(n_rows, inter)


def _row_experts(route: Route) -> Tensor:
    """The expert of each sorted row."""
    counts = route.offsets[1:] - route.offsets[:-1]
    experts = torch.arange(counts.shape[0], device=route.offsets.device)
    return torch.repeat_interleave(experts, counts, output_size=route.src.shape[0])


def _down_bias_term(dout, b_d, route: Route) -> Tensor:
    """``dot(dout[token], b_d[expert])`` of each sorted row: the down bias's share of the routing weight's
    gradient (the kernel's partials hold the GEMM's). One fp32 [tokens, experts] product, then a gather: the
    rows' gathered fp32 copies ([rows, hidden], top_k times the tokens) are never made."""
    per_token = dout.float() @ b_d.float().t()
    return per_token[route.src.long(), _row_experts(route)]


def _bwd_triton(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, route: Route, top_k, act, limit, alpha,
                out_first):  # fmt: skip
    dout = dout.contiguous()
    n_rows, hidden, inter = route.src.shape[0], x.shape[1], h.shape[1]
    glu = dict(act=act, limit=limit, alpha=alpha)
    grouped = wgrad_by_grouped_mm(x, h)
    # the down weight's gradient input (dout's rows times their weight), gathered by the GLU_BWD pass
    dsc = x.new_empty(n_rows, hidden) if grouped else None
    dgu = torch.empty_like(gate_up)
    part = torch.zeros(tk.col_blocks(inter), n_rows, dtype=torch.float32, device=x.device)
    tk.rows_gemm(tk.GLU_BWD, dout, route.src, w_d, not out_first, inter, route, out=dgu, weights=weights,
                 aux=gate_up, part=part, copy=dsc, **glu)  # fmt: skip
    d_weights = part.sum(0)
    if b_d is not None:
        d_weights = d_weights + _down_bias_term(dout, b_d, route)
    if grouped:  # before the input gradient's buffer, so the gathered copies are never alive together
        dw_d, db_d = _down_wgrad_grouped_mm(dsc, h, w_d, b_d, route, out_first)
        del dsc
    buf = x.new_empty(n_rows, hidden)
    tk.rows_gemm(tk.SCATTER, dgu, None, w_gu, not out_first, hidden, route, out=buf, w_up=w_up)
    dx = buf.view(-1, top_k, hidden).sum(1).to(x.dtype)
    del buf  # the weight gradients' buffers take its place
    if not grouped:
        return dx, d_weights, *_wgrad_triton(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, dgu, h, route,
                                             out_first)  # fmt: skip
    dw_gu, db_gu, dw_up = _gate_up_wgrad_grouped_mm(x, dgu, w_gu, b_gu, w_up, route, out_first)
    return dx, d_weights, dw_gu, dw_d, db_gu, db_d, dw_up


def wgrad_by_grouped_mm(x: Tensor, h: Tensor) -> bool:
    """Whether the weight gradients run as ``torch._grouped_mm`` (CUDA's grouped GEMM) rather than
    ``_wgrad_kernel``: on CUDA where this torch has it for the dtype, with rows of 16-byte multiples (its
    alignment rule). A GEMM with no epilogue to fuse: the vendor kernel is faster at large experts
    (docs/design/moe-experts.md)."""
    align = 16 // x.element_size()
    if not x.is_cuda or x.shape[1] % align or h.shape[1] % align:
        return False
    return _grouped_mm_runs(x.device.index or 0, x.dtype)


@functools.cache
def _grouped_mm_runs(device_index: int, dtype: torch.dtype) -> bool:
    a = torch.zeros(16, 16, dtype=dtype, device=torch.device("cuda", device_index))
    try:
        torch._grouped_mm(a.t(), a, offs=torch.tensor([8, 16], dtype=torch.int32, device=a.device))
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _gate_up_halves(dgu: Tensor, db_gu: Tensor | None, w_up: Tensor | None):
    """(gradient columns, bias-gradient columns) of each weight gate/up is read from: all of them for the one
    weight, else the gate's half and the up's half (strided views: the kernels read through the row stride)."""
    if w_up is None:
        return [(dgu, db_gu)]
    inter = dgu.shape[1] // 2
    bias = (None, None) if db_gu is None else (db_gu[:, :inter], db_gu[:, inter:])
    return [(dgu[:, :inter], bias[0]), (dgu[:, inter:], bias[1])]


def _wgrad_triton(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, dgu, h, route: Route, out_first):
    dw_gu, dw_d = torch.empty_like(w_gu), torch.empty_like(w_d)  # empty_like keeps a strided weight's strides
    dw_up = torch.empty_like(w_up) if w_up is not None else x.new_empty(0)
    db_gu = torch.empty_like(b_gu) if b_gu is not None else x.new_empty(0)
    db_d = torch.empty_like(b_d) if b_d is not None else x.new_empty(0)
    halves = _gate_up_halves(dgu, db_gu if b_gu is not None else None, w_up)
    for (g, db), dw in zip(halves, (dw_gu, dw_up), strict=False):
        tk.wgrad_gemm(g, None, x, route.src, route, out=dw, out_first=out_first, dbias=db)
    tk.wgrad_gemm(dout, route.src, h, None, route, out=dw_d, out_first=out_first, scale=weights,
                  dbias=db_d if b_d is not None else None)  # fmt: skip
    return dw_gu, dw_d, db_gu, db_d, dw_up


def _per_expert_grad(a: Tensor, b: Tensor, w: Tensor, route: Route, out_first: bool) -> Tensor:
    """[E, a_cols, b_cols] = a_e^T @ b_e over each expert's sorted rows (or its transpose), as
    ``torch._grouped_mm``, in ``w``'s layout (the fake's ``empty_like``): a weight stored as the transpose of a
    contiguous tensor (DBRX's down weight, [in, out] seen as [out, in]) gets the transposed product, no copy."""
    lhs, rhs = (a, b) if out_first else (b, a)  # the gradient of each expert's matrix is lhs^T @ rhs
    offs = route.offsets[1:]
    if w.stride(-1) == 1:
        return torch._grouped_mm(lhs.t(), rhs, offs=offs)
    return torch._grouped_mm(rhs.t(), lhs, offs=offs).transpose(1, 2)


def _bias_grad(g: Tensor, b: Tensor | None, route: Route) -> Tensor:
    """Each expert's sum of its rows of ``g``: a grouped GEMM of a block of ones (fp32 accumulation, no fp32 copy
    of ``g``); empty when there is no bias."""
    if b is None:
        return g.new_empty(0)
    ones = g.new_ones(g.shape[0], 16 // g.element_size())  # the narrowest block its alignment rule takes
    # row 0 of each expert's [block, N] product is a strided view: contiguous, as the fake says (the cast copies
    # only where the dtypes differ)
    return torch._grouped_mm(ones.t(), g, offs=route.offsets[1:])[:, 0].to(b.dtype).contiguous()


def _down_wgrad_grouped_mm(dsc, h, w_d, b_d, route: Route, out_first):
    """The down weight's and bias's gradients from the routing-weighted incoming gradient's sorted rows
    (``dsc``, rounded to the activations' dtype as :func:`_wgrad_triton` rounds its scaled loads)."""
    return _per_expert_grad(dsc, h, w_d, route, out_first), _bias_grad(dsc, b_d, route)


def _gate_up_wgrad_grouped_mm(x, dgu, w_gu, b_gu, w_up, route: Route, out_first):
    """The gate/up weights' and bias's gradients as ``torch._grouped_mm`` over the gathered hidden states."""
    xs = x[route.src.long()]
    halves = _gate_up_halves(dgu, None, w_up)
    stacked = (w_gu,) if w_up is None else (w_gu, w_up)
    grads = [_per_expert_grad(g, xs, w, route, out_first) for (g, _), w in zip(halves, stacked, strict=True)]
    del xs
    return grads[0], _bias_grad(dgu, b_gu, route), grads[1] if w_up is not None else x.new_empty(0)


def _bwd_impl(
    dout: Tensor, x: Tensor, weights: Tensor, w_gu: Tensor, w_d: Tensor, b_gu: Tensor | None, b_d: Tensor | None,
    w_up: Tensor | None, gate_up: Tensor, h: Tensor, src: Tensor, dest: Tensor, offsets: Tensor, blocks: Tensor,
    block_m: int, top_k: int, act: str, limit: float, alpha: float, out_first: bool, backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    if backend == "torch":
        return ref.experts_bwd_torch(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, src, dest, offsets, top_k,
                              act, limit, alpha, out_first)  # fmt: skip
    route = Route(src, dest, offsets, blocks, block_m)
    return _bwd_triton(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, route, top_k, act, limit, alpha,
                       out_first)  # fmt: skip


def _bwd_fake(dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, *rest):
    def maybe(t):  # the gradient of an optional input: empty when it is absent
        return torch.empty_like(t) if t is not None else x.new_empty(0)

    d_weights = torch.empty(weights.shape, dtype=torch.float32, device=x.device)
    return torch.empty_like(x), d_weights, torch.empty_like(w_gu), torch.empty_like(w_d), maybe(b_gu), \
        maybe(b_d), maybe(w_up)  # fmt: skip


experts_bwd = define_op("moe_experts_bwd", _bwd_impl, fake=_bwd_fake)


def _setup(ctx, inputs, output):
    x, weights, w_gu, w_d, b_gu, b_d, w_up, src, dest, offsets, blocks, *consts = inputs
    _, gate_up, h = output
    ctx.save_for_backward(x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, src, dest, offsets, blocks)
    ctx.consts = tuple(consts)


def _backward(ctx, dout, _d_gate_up, _d_h):
    x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, src, dest, offsets, blocks = ctx.saved_tensors
    dx, d_weights, dw_gu, dw_d, db_gu, db_d, dw_up = experts_bwd.from_backward(
        ctx, dout, x, weights, w_gu, w_d, b_gu, b_d, w_up, gate_up, h, src, dest, offsets, blocks, *ctx.consts
    )
    optional = [g if t is not None else None for g, t in ((db_gu, b_gu), (db_d, b_d), (dw_up, w_up))]
    return (dx, d_weights.to(weights.dtype), dw_gu, dw_d, *optional, *([None] * (4 + len(ctx.consts))))


experts_fwd = define_op(
    "moe_experts", _fwd_impl, setup=_setup, backward=_backward, fake=_fwd_fake, aux=(1, 2)
)


def _call(backend: str):
    def run(x, weights, w_gu, w_d, b_gu, b_d, w_up, route: Route, top_k, act, limit, alpha, out_first):
        out, _, _ = experts_fwd(x, weights, w_gu, w_d, b_gu, b_d, w_up, route.src, route.dest, route.offsets,
                                route.blocks, route.block_m, top_k, act, float(limit), float(alpha), out_first,
                                backend)  # fmt: skip
        return out

    return run


MOE_EXPERTS = register(Op("moe_experts", torch_impl=_call("torch"), triton_impl=_call("triton")))
