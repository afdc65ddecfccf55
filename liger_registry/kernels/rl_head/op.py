"""The RL head's custom ops: per-token log-probs and distribution statistics of ``hidden @ weight.T`` in tiles,
and their backward.

* ``rl_head_fwd``: ``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1, log_z, tile_entropy)`` [N] of the
  transformed logits ``z = softcap * tanh(scale * x / softcap)`` (``scale * x`` without a softcap; a temperature
  is folded into both), outputs not asked for (``flags``) empty. Differentiable in hidden, weight and bias
  through ``log_probs`` and ``entropy``. ``log_z`` and ``tile_entropy`` (empty unless it differs from ``entropy``)
  are what the backward reads.
* ``rl_head_bwd``: ``(d hidden, d weight, d bias)`` from the upstream gradients of log_probs and entropy (an
  empty gradient: that output got none).
* The tiles (``tile_plan``): every token at once when the tile budget allows (then d weight is one GEMM per
  vocabulary slab written straight into the output, no fp32 accumulator), vocabulary slabs of a multiple of 128
  columns. Forward and backward walk the slabs in the outer loop; d hidden accumulates over the slabs in fp32.
* 16-bit inputs: the target's logit is computed exactly (fp32 dot product, ``flce.target``) and replaces the
  tile's rounded one in every statistic (``stats.with_exact_target``).
* Only one tile of logits exists at a time, forward and backward. Every target must lie in ``[0, V)``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import torch
from torch import Tensor

from ..backend import Op, register
from ..define import define_op
from ..flce.target import needs_exact_target, target_logits
from . import reference, triton_kernels
from .stats import Flags, finish, new_state, with_exact_target

DEFAULT_TILE_MIB = 512.0
TOKEN_TILE_MAX = 32768  # beyond it the tokens are split (and d weight accumulates in fp32)
COLUMN_MULTIPLE = 128


class TilePlan(NamedTuple):
    tokens: int
    columns: int


def tile_plan(n: int, v: int, itemsize: int, max_tile_mib: float | None = None) -> TilePlan:
    """Tokens and vocabulary columns of one logits tile of at most ``max_tile_mib`` (default 512 MiB): all the
    tokens (up to ``TOKEN_TILE_MAX``) and as many columns as the budget leaves, a multiple of 128 (at least 128)."""
    budget = float(DEFAULT_TILE_MIB if max_tile_mib is None else max_tile_mib) * 2**20 / itemsize
    tokens = max(1, min(n, TOKEN_TILE_MAX, int(budget // COLUMN_MULTIPLE)))
    columns = int(budget // tokens) // COLUMN_MULTIPLE * COLUMN_MULTIPLE
    return TilePlan(tokens, max(COLUMN_MULTIPLE, min(columns, v)))


def _kernels(backend: str):
    if backend == "triton":
        return triton_kernels.fold_tile_triton, triton_kernels.grad_tile_triton
    return reference.fold_tile_torch, reference.grad_tile_torch


def _tile(buf, h, w, b):
    """``h @ w.T (+ b)`` into the front of ``buf``."""
    out = buf[: h.shape[0] * w.shape[0]].view(h.shape[0], w.shape[0])
    if b is None:
        return torch.mm(h, w.t(), out=out)
    return torch.addmm(b, h, w.t(), out=out)


def _slabs(v: int, columns: int):
    for v0 in range(0, v, columns):
        yield v0, min(v0 + columns, v)


def _rl_head_fwd_impl(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    softcap: float | None,
    scale: float,
    flags: int,
    token_tile: int,
    vocab_tile: int,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    n, v = hidden.shape[0], weight.shape[0]
    f = Flags.from_mask(flags)
    fold, _ = _kernels(backend)
    state = new_state(n, hidden.device)
    buf = hidden.new_empty(min(n, token_tile) * min(v, vocab_tile)) if n else None
    for v0, v1 in _slabs(v, vocab_tile):
        w = weight[v0:v1].to(hidden.dtype)
        b = None if bias is None else bias[v0:v1].to(hidden.dtype)
        for t0 in range(0, n, token_tile):
            t1 = min(t0 + token_tile, n)
            tile = _tile(buf, hidden[t0:t1], w, b)
            fold(tile, target[t0:t1], state.__class__(*(s[t0:t1] for s in state)), v0, softcap, scale, f)
    lp, ent, sq, mean, top1, log_z = finish(state, target, v, f)
    if not (n and needs_exact_target(hidden)):
        return lp, ent, sq, mean, top1, log_z, log_z.new_empty(0)
    # the outputs take the exact target logit; the backward keeps the tile's own log Z and entropy, with which
    # its probabilities sum to one (the gradient of a confident row is the small 1 - p of its target)
    opts = SimpleNamespace(ignore_index=-1, softcap=softcap, logit_scale=scale)
    exact = with_exact_target(state, target_logits(hidden, weight, target, bias, opts, backend))
    lp, ent_exact, sq, mean, _, _ = finish(exact, target, v, f)
    return lp, ent_exact, sq, mean, top1, log_z, ent


def _addmm_fp32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` for an fp32 ``acc`` without rounding the product to 16 bits first."""
    if acc.dtype == a.dtype == b.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda and a.dtype == b.dtype:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())


def _mm_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out = a @ b`` (fp32 accumulation inside the GEMM), in ``out``'s dtype."""
    if out.dtype == a.dtype == b.dtype:
        torch.mm(a, b, out=out)
    elif out.is_cuda and out.dtype == torch.float32 and a.dtype == b.dtype:
        torch.mm(a, b, out_dtype=torch.float32, out=out)
    else:
        out.copy_(a.float() @ b.float())


def _rl_head_bwd_impl(
    g_lp: Tensor,
    g_ent: Tensor,
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    log_z: Tensor,
    entropy: Tensor,
    softcap: float | None,
    scale: float,
    token_tile: int,
    vocab_tile: int,
    need_dh: bool,
    need_dw: bool,
    need_db: bool,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    n, v = hidden.shape[0], weight.shape[0]
    _, grad = _kernels(backend)
    g_lp = g_lp.float().contiguous() if g_lp.numel() else None
    g_ent = g_ent.float().contiguous() if g_ent.numel() else None
    f32 = {"dtype": torch.float32, "device": hidden.device}
    dh = torch.zeros((n, hidden.shape[1]), **f32) if need_dh else None
    one_token_tile = n <= token_tile
    # one token tile: each slab's d weight is one GEMM over every token, written in the weight's dtype
    dw = None
    if need_dw:
        dw = weight.new_empty(weight.shape) if one_token_tile else torch.zeros(weight.shape, **f32)
    db = torch.zeros(v, **f32) if need_db else None
    buf = hidden.new_empty(min(n, token_tile) * min(v, vocab_tile)) if n else None
    if n == 0 and dw is not None:
        dw.zero_()
    for v0, v1 in _slabs(v, vocab_tile) if n else ():
        w = weight[v0:v1].to(hidden.dtype)
        b = None if bias is None else bias[v0:v1].to(hidden.dtype)
        for t0 in range(0, n, token_tile):
            t1 = min(t0 + token_tile, n)
            h = hidden[t0:t1]
            tile = _tile(buf, h, w, b)
            rows = slice(t0, t1)
            ent = entropy[rows] if entropy.numel() else None
            grad(tile, target[rows], log_z[rows], ent, _at(g_lp, rows), _at(g_ent, rows), v0, softcap, scale)
            if dh is not None:
                _addmm_fp32(dh[rows], tile, w)
            if dw is not None and one_token_tile:
                _mm_into(dw[v0:v1], tile.t(), h)
            elif dw is not None:
                _addmm_fp32(dw[v0:v1], tile.t(), h)
            if db is not None:
                db[v0:v1] += tile.sum(0, dtype=torch.float32)
    return (  # each absent gradient an empty tensor of its own: a custom op's outputs may not alias
        hidden.new_empty(0) if dh is None else dh.to(hidden.dtype),
        hidden.new_empty(0) if dw is None else dw.to(weight.dtype),
        hidden.new_empty(0) if db is None else db.to(bias.dtype),
    )


def _at(g: Tensor | None, rows: slice) -> Tensor | None:
    return None if g is None else g[rows]


def _fwd_fake(hidden, weight, bias, target, softcap, scale, flags, token_tile, vocab_tile, backend):
    n = hidden.shape[0]
    f = Flags.from_mask(flags)

    def vec(on: bool, dtype=torch.float32):
        return hidden.new_empty(n if on else 0, dtype=dtype)

    exact = hidden.element_size() < 4  # flce.target.needs_exact_target (no tokens: empty either way)
    return (
        vec(True),
        vec(f.entropy),
        vec(f.log_sum_sq_probs),
        vec(f.mean_logits),
        vec(f.is_top1, torch.bool),
        vec(True),
        vec(exact and f.entropy),
    )


def _bwd_fake(g_lp, g_ent, hidden, weight, bias, target, log_z, entropy, *rest):
    need_dh, need_dw, need_db = rest[-4:-1]
    return (
        torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_dh else hidden.new_empty(0),
        torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dw else hidden.new_empty(0),
        bias.new_empty(bias.shape) if need_db and bias is not None else hidden.new_empty(0),
    )


RL_HEAD_BWD = define_op("rl_head_bwd", _rl_head_bwd_impl, fake=_bwd_fake)


def _setup(ctx, inputs, output):
    hidden, weight, bias, target, softcap, scale, _, token_tile, vocab_tile, backend = inputs
    tile_entropy = output[6] if output[6].numel() else output[1]
    ctx.save_for_backward(hidden, weight, bias, target, output[5], tile_entropy)
    ctx.run = (softcap, scale, token_tile, vocab_tile)
    ctx.backend = backend


def _backward(ctx, g_lp, g_ent, *_):
    hidden, weight, bias, target, log_z, entropy = ctx.saved_tensors
    need = ctx.needs_input_grad
    empty = log_z.new_empty(0)
    none = (None,) * 7
    if (g_lp is None and g_ent is None) or not any(need[:3]):
        return (None, None, None, *none)
    dh, dw, db = RL_HEAD_BWD.from_backward(
        ctx,
        empty if g_lp is None else g_lp,
        empty if g_ent is None or not entropy.numel() else g_ent,
        hidden,
        weight,
        bias,
        target,
        log_z,
        entropy,
        *ctx.run,
        need[0],
        need[1],
        bias is not None and need[2],
        ctx.backend,
    )
    return (
        dh if need[0] else None,
        dw if need[1] else None,
        db if bias is not None and need[2] else None,
        *none,
    )


# explicit fakes: the tile loops' Python arithmetic on N would specialise a dynamic N
RL_HEAD_FWD = define_op(
    "rl_head_fwd", _rl_head_fwd_impl, setup=_setup, backward=_backward, fake=_fwd_fake, aux=(2, 3, 4, 5, 6)
)


def _on(backend: str):
    def run(hidden, weight, bias, target, softcap, scale, flags, token_tile, vocab_tile):
        return RL_HEAD_FWD(
            hidden, weight, bias, target, softcap, scale, flags, token_tile, vocab_tile, backend
        )

    return run


FUSED_LINEAR_LOGPROBS = register(
    Op("fused_linear_logprobs", torch_impl=_on("torch"), triton_impl=_on("triton"))
)
