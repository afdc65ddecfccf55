"""Triton grouped GEMMs of the MoE experts, one launch per GEMM over every expert, rows sorted by expert.

Two kernel shapes serve the four GEMMs of a step and the four of its backward:

* ``_rows_kernel``: ``C[s, n] = sum_k A[row(s), k] * B[e, n, k]`` over blocks of sorted rows, each block within
  one expert (the routing table gives each program its expert and rows; an idle block returns at once, so an
  expert with no tokens costs nothing). ``A``'s rows are read through an index when the tokens are gathered
  (the hidden states, the incoming gradient): the gathered copy is never written. The epilogue is the mode's:

  - ``GLU_FWD``: gate and up accumulated side by side (a ``[gate | up]`` split or interleaved pairs, or with
    ``SPLIT`` the up rows read from a second weight of the same strides: DBRX's separate ``w1`` / ``v1``), the
    bias added, both stored (the backward's activation input) and ``act(gate) * up`` stored;
  - ``SCATTER_WEIGHTED``: the down projection's bias added, times the routing weight, written to the row's
    place in token order (the sum over top-k is one reduction afterwards, deterministic);
  - ``GLU_BWD``: the gradient of the down GEMM's input, then the activation's backward on the saved gate/up and
    the routing weight's gradient (a per-column-block partial of ``dot(G, h)``): one pass; with ``copy``, the
    gathered incoming-gradient rows times their routing weight are stored as they stream through the K loop
    (the down weight's gradient input when CUDA's grouped GEMM computes it: no separate gather);
  - ``SCATTER``: the input gradient written to the row's place in token order (``SPLIT``: its K loop in two
    halves, the gate weight's then the up weight's).

* ``_wgrad_kernel``: ``dW[e, m, n] = sum_{s in e} A[row(s), m] * B[row(s), n]``, the weight gradients, one
  program per expert and output tile, looping over that expert's rows; the bias gradient (the sum of ``A``) comes
  from the same loads.

Every weight is read and written through its strides, so transformers' two layouts (``[E, out, in]`` and the
transposed ``[E, in, out]``) are the same kernels. Rounded as transformers' grouped experts round: each GEMM's
result to the activations' dtype, then the bias, then the activation (``_act_and_grad``, the GLU op's), the
routing weight's product in the promoted dtype.
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import triton.language as tl

from ..glu import triton_kernels as glu_triton
from ..glu.triton_kernels import _KINDS as ACT_CODES
from ..glu.triton_kernels import _act_and_grad, _round
from ..triton_utils import cdiv
from . import tuning

GLU_FWD, SCATTER_WEIGHTED, GLU_BWD, SCATTER = (tuning.GLU_FWD, tuning.SCATTER_WEIGHTED, tuning.GLU_BWD,
                                             tuning.SCATTER)  # fmt: skip


@triton.jit
def _swizzle(pid, n_m, n_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a 1-D launch, GROUP_M row blocks at a time over every column block: the rows of a
    group stay in L2 while the weights stream (row-major order would re-read the gathered rows per column)."""
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def _load_pair(base, rows, stride, col0, mask, UP_OFF: tl.constexpr, STEP: tl.constexpr, BN: tl.constexpr):
    """The gate and up halves, columns ``col0 + [0, BN)``, of a [rows, 2N] tensor: a ``[gate | up]`` split, or
    interleaved pairs read as one contiguous [rows, 2 BN] tile."""
    row_ptr = base + rows.to(tl.int64)[:, None] * stride
    if STEP == 2:
        cols2 = col0 * 2 + tl.arange(0, 2 * BN)
        mask2 = tl.reshape(tl.join(mask, mask), (mask.shape[0], 2 * BN))
        pair = tl.load(row_ptr + cols2[None, :], mask=mask2, other=0.0)
        return tl.split(tl.reshape(pair, (mask.shape[0], BN, 2)))
    cols = col0 + tl.arange(0, BN)
    g = tl.load(row_ptr + cols[None, :], mask=mask, other=0.0)
    return g, tl.load(row_ptr + cols[None, :] + UP_OFF, mask=mask, other=0.0)


@triton.jit
def _store_pair(
    base, rows, stride, col0, mask, g, u, UP_OFF: tl.constexpr, STEP: tl.constexpr, BN: tl.constexpr
):
    """Store the gate and up halves (the layout of :func:`_load_pair`)."""
    row_ptr = base + rows.to(tl.int64)[:, None] * stride
    if STEP == 2:
        cols2 = col0 * 2 + tl.arange(0, 2 * BN)
        mask2 = tl.reshape(tl.join(mask, mask), (mask.shape[0], 2 * BN))
        tl.store(row_ptr + cols2[None, :], tl.reshape(tl.join(g, u), (mask.shape[0], 2 * BN)), mask=mask2)
    else:
        cols = col0 + tl.arange(0, BN)
        tl.store(row_ptr + cols[None, :], g, mask=mask)
        tl.store(row_ptr + cols[None, :] + UP_OFF, u, mask=mask)


@triton.jit
def _k_loop(
    acc, A, arow, stride_a, a_col0, rmask, b_base, stride_bn, stride_bk, bcols, bcmask, K,
    copy_rows, copy_scale, PREC: tl.constexpr, BK: tl.constexpr, HAS_COPY: tl.constexpr,
):  # fmt: skip
    """``acc += A[arow, a_col0 + k] @ B[k, bcols]`` over ``k`` in ``[0, K)``: one weight's share of a GEMM.
    ``HAS_COPY``: the A tiles, times ``copy_scale`` per row, also stored at ``copy_rows`` (row pointers): a
    gathered, scaled copy made from loads the GEMM does anyway."""
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        kmask = ks < K
        a = tl.load(
            A + arow[:, None] * stride_a + a_col0 + ks[None, :],
            mask=rmask[:, None] & kmask[None, :],
            other=0.0,
        )
        if HAS_COPY:
            scaled = (a.to(tl.float32) * copy_scale[:, None]).to(copy_rows.dtype.element_ty)
            tl.store(copy_rows + ks[None, :], scaled, mask=rmask[:, None] & kmask[None, :])
        b_ptr = b_base + bcols[None, :] * stride_bn + ks[:, None] * stride_bk
        b = tl.load(b_ptr, mask=kmask[:, None] & bcmask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PREC)
    return acc


@triton.jit
def _rows_kernel(
    A, stride_a, A_IDX,
    B, B2, stride_be, stride_bn, stride_bk,
    BIAS, stride_bias,
    C, stride_c, C2, stride_c2,
    DEST, W, AUX, stride_aux, PART, stride_part, COPY, stride_copy,
    BLOCKS, n_blocks, N, K, limit, alpha,
    MODE: tl.constexpr, HAS_IDX: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_COPY: tl.constexpr, ACT: tl.constexpr,
    UP_OFF: tl.constexpr, STEP: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, PERSISTENT: tl.constexpr,
):  # fmt: skip
    n_n = tl.cdiv(N, BN)
    if PERSISTENT:  # a program per SM slot, striding over the (row block, column block) tiles
        for tile in range(tl.program_id(0), n_blocks * n_n, tl.num_programs(0)):
            pid_m, pid_n = _swizzle(tile, n_blocks, n_n, GROUP_M)
            e = tl.load(BLOCKS + pid_m)
            if e >= 0:
                _rows_tile(A, stride_a, A_IDX, B, B2, stride_be, stride_bn, stride_bk, BIAS, stride_bias, C,
                           stride_c, C2, stride_c2, DEST, W, AUX, stride_aux, PART, stride_part, COPY, stride_copy,
                           BLOCKS, n_blocks, N, K, limit, alpha, pid_m, pid_n, e, MODE, HAS_IDX, HAS_BIAS,
                           HAS_COPY, ACT, UP_OFF, STEP, SPLIT, PREC, BM, BN, BK)  # fmt: skip
    else:
        pid_m, pid_n = _swizzle(tl.program_id(0), n_blocks, n_n, GROUP_M)
        e = tl.load(BLOCKS + pid_m)
        if e >= 0:  # an idle block (past the routed rows) does nothing
            _rows_tile(A, stride_a, A_IDX, B, B2, stride_be, stride_bn, stride_bk, BIAS, stride_bias, C,
                       stride_c, C2, stride_c2, DEST, W, AUX, stride_aux, PART, stride_part, COPY, stride_copy,
                       BLOCKS, n_blocks, N, K, limit, alpha, pid_m, pid_n, e, MODE, HAS_IDX, HAS_BIAS,
                       HAS_COPY, ACT, UP_OFF, STEP, SPLIT, PREC, BM, BN, BK)  # fmt: skip


@triton.jit
def _rows_tile(
    A, stride_a, A_IDX,
    B, B2, stride_be, stride_bn, stride_bk,
    BIAS, stride_bias,
    C, stride_c, C2, stride_c2,
    DEST, W, AUX, stride_aux, PART, stride_part, COPY, stride_copy,
    BLOCKS, n_blocks, N, K, limit, alpha, pid_m, pid_n, e,
    MODE: tl.constexpr, HAS_IDX: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_COPY: tl.constexpr, ACT: tl.constexpr,
    UP_OFF: tl.constexpr, STEP: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """One [BM, BN] tile of row block ``pid_m`` (expert ``e``), column block ``pid_n``."""
    start = tl.load(BLOCKS + n_blocks + pid_m)
    end = tl.load(BLOCKS + 2 * n_blocks + pid_m)
    rows = start + tl.arange(0, BM)
    rmask = rows < end
    if HAS_IDX:
        arow = tl.load(A_IDX + rows, mask=rmask, other=0).to(tl.int64)
    else:
        arow = rows.to(tl.int64)
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = cols < N
    b_base = B + e.to(tl.int64) * stride_be
    GATE_UP: tl.constexpr = MODE == 0
    WIDE: tl.constexpr = 2 if (GATE_UP and STEP == 2) else 1  # interleaved pairs: one [BK, 2 BN] tile
    bcols = pid_n * BN * WIDE + tl.arange(0, BN * WIDE)
    bcmask = bcols < N * WIDE
    # the up rows: UP_OFF rows past the gate's in the one weight, or the same rows of the second (SPLIT)
    up_base = B2 + e.to(tl.int64) * stride_be if SPLIT else b_base + UP_OFF * stride_bn
    acc = tl.zeros((BM, BN * WIDE), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    # HAS_COPY (GLU_BWD): the first column block's programs also write the gathered rows times their weight, in
    # a loop of their own (the other programs' loop stays a plain GEMM's)
    copy_rows = COPY + rows.to(tl.int64)[:, None] * stride_copy
    w_rows = tl.load(W + rows, mask=rmask, other=0.0).to(tl.float32) if HAS_COPY else rmask.to(tl.float32)
    if GATE_UP:
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            kmask = ks < K
            a = tl.load(
                A + arow[:, None] * stride_a + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0
            )
            bmask = kmask[:, None] & bcmask[None, :]
            b_off = bcols[None, :] * stride_bn + ks[:, None] * stride_bk
            acc = tl.dot(a, tl.load(b_base + b_off, mask=bmask, other=0.0), acc, input_precision=PREC)
            if STEP == 1:
                b_up = tl.load(up_base + b_off, mask=bmask, other=0.0)
                acc_up = tl.dot(a, b_up, acc_up, input_precision=PREC)
    elif SPLIT:
        # dX = dgu @ [W_gate | W_up]: dgu's gate columns times the gate weight, its up columns the up weight
        half = K // 2
        acc = _k_loop(acc, A, arow, stride_a, 0, rmask, b_base, stride_bn, stride_bk, bcols, bcmask, half,
                      copy_rows, w_rows, PREC, BK, False)  # fmt: skip
        acc = _k_loop(acc, A, arow, stride_a, half, rmask, up_base, stride_bn, stride_bk, bcols, bcmask, half,
                      copy_rows, w_rows, PREC, BK, False)  # fmt: skip
    elif HAS_COPY:
        if pid_n == 0:
            acc = _k_loop(acc, A, arow, stride_a, 0, rmask, b_base, stride_bn, stride_bk, bcols, bcmask, K,
                          copy_rows, w_rows, PREC, BK, True)  # fmt: skip
        else:
            acc = _k_loop(acc, A, arow, stride_a, 0, rmask, b_base, stride_bn, stride_bk, bcols, bcmask, K,
                          copy_rows, w_rows, PREC, BK, False)  # fmt: skip
    else:
        acc = _k_loop(acc, A, arow, stride_a, 0, rmask, b_base, stride_bn, stride_bk, bcols, bcmask, K,
                      copy_rows, w_rows, PREC, BK, False)  # fmt: skip
    mask = rmask[:, None] & cmask[None, :]
    DT = C.dtype.element_ty
    if MODE == 0:
        if STEP == 2:
            g, u = tl.split(tl.reshape(acc, (BM, BN, 2)))
        else:
            g, u = acc, acc_up
        g = _round(g, DT)
        u = _round(u, DT)
        if HAS_BIAS:
            bias = BIAS + e.to(tl.int64) * stride_bias
            bg, bu = _load_pair(
                bias, tl.zeros((1,), tl.int32), 0, pid_n * BN, cmask[None, :], UP_OFF, STEP, BN
            )
            g = _round(g + bg.to(tl.float32), DT)
            u = _round(u + bu.to(tl.float32), DT)
        _store_pair(C, rows, stride_c, pid_n * BN, mask, g.to(DT), u.to(DT), UP_OFF, STEP, BN)
        y, _, _ = _act_and_grad(g, u, limit, alpha, ACT, DT)
        out2 = C2 + rows.to(tl.int64)[:, None] * stride_c2 + cols[None, :]
        tl.store(out2, y.to(C2.dtype.element_ty), mask=mask)
    elif MODE == 1:
        y = _round(acc, A.dtype.element_ty)
        if HAS_BIAS:
            bias = tl.load(BIAS + e.to(tl.int64) * stride_bias + cols, mask=cmask, other=0.0).to(tl.float32)
            y = _round(y + bias[None, :], A.dtype.element_ty)
        w = tl.load(W + rows, mask=rmask, other=0.0).to(tl.float32)
        dest = tl.load(DEST + rows, mask=rmask, other=0).to(tl.int64)
        tl.store(C + dest[:, None] * stride_c + cols[None, :], (y * w[:, None]).to(DT), mask=mask)
    elif MODE == 2:
        g, u = _load_pair(AUX, rows, stride_aux, pid_n * BN, mask, UP_OFF, STEP, BN)
        y, dg, du = _act_and_grad(g.to(tl.float32), u.to(tl.float32), limit, alpha, ACT, AUX.dtype.element_ty)
        y = tl.where(mask, y, 0.0)
        tl.store(PART + pid_n * stride_part + rows, tl.sum(acc * y, axis=1), mask=rmask)
        w = tl.load(W + rows, mask=rmask, other=0.0).to(tl.float32)
        dh = acc * w[:, None]
        _store_pair(C, rows, stride_c, pid_n * BN, mask, (dh * dg).to(DT), (dh * du).to(DT), UP_OFF, STEP, BN)
    else:
        dest = tl.load(DEST + rows, mask=rmask, other=0).to(tl.int64)
        tl.store(C + dest[:, None] * stride_c + cols[None, :], acc.to(DT), mask=mask)


@triton.jit
def _wgrad_kernel(
    A, stride_a, A_IDX, W, B, stride_b, B_IDX,
    OUT, stride_oe, stride_om, stride_on, DBIAS, stride_dbias,
    OFFSETS, M, N,
    HAS_A_IDX: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_B_IDX: tl.constexpr, HAS_DBIAS: tl.constexpr,
    PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = _swizzle(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), 8)
    e = tl.program_id(1)
    start = tl.load(OFFSETS + e)
    end = tl.load(OFFSETS + e + 1)
    ms = pid_m * BM + tl.arange(0, BM)
    ns = pid_n * BN + tl.arange(0, BN)
    mmask = ms < M
    nmask = ns < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    bsum = tl.zeros((BM,), dtype=tl.float32)
    for s0 in range(start, end, BK):
        ss = s0 + tl.arange(0, BK)
        smask = ss < end
        arow = tl.load(A_IDX + ss, mask=smask, other=0).to(tl.int64) if HAS_A_IDX else ss.to(tl.int64)
        brow = tl.load(B_IDX + ss, mask=smask, other=0).to(tl.int64) if HAS_B_IDX else ss.to(tl.int64)
        a = tl.load(
            A + arow[:, None] * stride_a + ms[None, :], mask=smask[:, None] & mmask[None, :], other=0.0
        )
        if HAS_SCALE:
            w = tl.load(W + ss, mask=smask, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * w[:, None]).to(B.dtype.element_ty)
        b = tl.load(
            B + brow[:, None] * stride_b + ns[None, :], mask=smask[:, None] & nmask[None, :], other=0.0
        )
        acc = tl.dot(tl.trans(a), b, acc, input_precision=PREC)
        if HAS_DBIAS:
            bsum += tl.sum(a.to(tl.float32), axis=0)
    out = OUT + e.to(tl.int64) * stride_oe + ms[:, None] * stride_om + ns[None, :] * stride_on
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
    if HAS_DBIAS:
        if pid_n == 0:
            dbias = DBIAS + e.to(tl.int64) * stride_dbias + ms
            tl.store(dbias, bsum.to(DBIAS.dtype.element_ty), mask=mmask)


# ---------------------------------------------------------------- launchers
MIN_BN = tuning.MIN_BN  # the narrowest column block of a rows launch
# the cache files are named by a hash of these kernels' text and the activations' they inline
_SOURCES = (Path(__file__), Path(glu_triton.__file__))
ROWS_TUNER = tuning.tuner("moe_rows", _rows_kernel, _SOURCES)
WGRAD_TUNER = tuning.tuner("moe_wgrad", _wgrad_kernel, _SOURCES)


def col_blocks(n: int) -> int:
    """An upper bound of the column blocks of a rows launch over ``n`` columns (the routing weight's partials
    have one row per block; the tuner picks the block)."""
    return cdiv(n, MIN_BN)


def _precision(t: torch.Tensor) -> str:
    """fp32 GEMMs in full precision (the eager matmul's), not TF32."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def _rows_bucket(route) -> int:
    """The shape bucket's row count: the routed rows rounded up to a power of two (a step's exact count varies
    with nothing but the batch, and one search per bucket is enough)."""
    # triton.next_power_of_2 is a constexpr function in Triton 3.9: ~7 us per host call
    return 1 << max(route.dest.numel() - 1, 0).bit_length()


def _experts(route) -> int:
    return route.offsets.shape[0] - 1


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _nk_strides(w: torch.Tensor, out_first: bool) -> tuple[int, int, int]:
    """Strides (expert, n, k) of the per-expert matrix read as [n = output feature, k = input feature]."""
    se, s1, s2 = w.stride()
    return (se, s1, s2) if out_first else (se, s2, s1)


def rows_gemm(
    mode: int,
    a: torch.Tensor,
    a_idx: torch.Tensor | None,
    w: torch.Tensor,
    out_first: bool,
    n: int,
    route,
    *,
    out: torch.Tensor,
    out2: torch.Tensor | None = None,
    w_up: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    aux: torch.Tensor | None = None,
    part: torch.Tensor | None = None,
    copy: torch.Tensor | None = None,
    act: str = "swiglu",
    limit: float = 0.0,
    alpha: float = 0.0,
) -> tuning.TileConfig:
    """One ``_rows_kernel`` launch over every expert (see the module docstring for the modes). ``w``: the stacked
    weight, ``out_first``: whether its per-expert matrix is [n, k] (else [k, n]); ``n``: output columns (the
    intermediate size for the GLU modes). ``w_up``: the up weight when ``w`` holds only the gate's (same shape and
    strides; GLU_FWD and SCATTER). ``copy`` [rows, k] (GLU_BWD): receives ``a[a_idx] * weights``. Returns the
    tile config it ran."""
    if copy is not None and mode != GLU_BWD:
        raise ValueError("rows_gemm: copy is written by the GLU_BWD mode only")
    if w_up is not None and w_up.stride() != w.stride():
        raise ValueError(
            f"rows_gemm: the up weight's strides {w_up.stride()} are not its gate's {w.stride()}"
        )
    k = a.shape[1]
    n_blocks = route.blocks.shape[1]
    up_off, step = (1, 2) if act == "clamped_swiglu" else (n, 1)  # GPT-OSS's pairs interleave, as in glu
    dummy = out
    strides = _nk_strides(w, out_first)

    persistent = tuning.PERSISTENT
    slots = tuning.program_slots(a.device) if persistent else 0

    def grid(meta):
        tiles = n_blocks * cdiv(n, meta["BN"])
        return (min(tiles, slots) if persistent else tiles,)

    args = (
        a, a.stride(0), a_idx if a_idx is not None else dummy,
        w, w_up if w_up is not None else w, *strides,
        bias if bias is not None else dummy, bias.stride(0) if bias is not None else 0,
        out, out.stride(0), out2 if out2 is not None else dummy, out2.stride(0) if out2 is not None else 0,
        route.dest, weights if weights is not None else dummy,
        aux if aux is not None else dummy, aux.stride(0) if aux is not None else 0,
        part if part is not None else dummy, part.stride(0) if part is not None else 0,
        copy if copy is not None else dummy, copy.stride(0) if copy is not None else 0,
        route.blocks, n_blocks, n, k, float(limit), float(alpha),
    )  # fmt: skip
    consts = dict(
        MODE=mode, HAS_IDX=a_idx is not None, HAS_BIAS=bias is not None, HAS_COPY=copy is not None,
        ACT=ACT_CODES[act], UP_OFF=up_off, STEP=step, SPLIT=w_up is not None, PREC=_precision(w),
        BM=route.block_m, PERSISTENT=persistent,
    )  # fmt: skip
    rows, experts = _rows_bucket(route), _experts(route)
    # the weight's layout: rows of k (a [n, k] matrix read along k) or of n; the same sizes tile differently
    sizes = dict(
        N=n, K=k, ROWS=rows, E=experts, dtype=_dtype(a), out=_dtype(out), W="nk" if strides[2] == 1 else "kn"
    )

    def candidates():
        split = w_up is not None
        return tuning.rows_candidates(
            tuning.RowsShape(mode, n, k, rows, experts, route.block_m, step, split, a.element_size())
        )

    # the routing weight's partials: one row per column block, and the block differs per config; every trial
    # starts from the zeros the caller gave, so rows a wider block leaves unwritten stay zero
    restore = [part] if part is not None else []
    return ROWS_TUNER.launch(grid, args, consts, sizes, candidates, a.device, restore)


def wgrad_gemm(
    a: torch.Tensor,
    a_idx: torch.Tensor | None,
    b: torch.Tensor,
    b_idx: torch.Tensor | None,
    route,
    *,
    out: torch.Tensor,
    out_first: bool,
    scale: torch.Tensor | None = None,
    dbias: torch.Tensor | None = None,
) -> tuning.TileConfig:
    """``out[e] = A_e^T @ B_e`` over each expert's rows (``A``: [rows, m], ``B``: [rows, n]), written into the
    stacked weight gradient ``out`` whose per-expert matrix is [m, n] when ``out_first`` (else [n, m]); ``scale``
    multiplies A's rows; ``dbias`` [E, m] receives the sum of A's rows."""
    m, n = a.shape[1], b.shape[1]
    se, s_m, s_n = _nk_strides(out, out_first)

    def grid(meta):
        return (cdiv(m, meta["BM"]) * cdiv(n, meta["BN"]), out.shape[0])

    args = (
        a, a.stride(0), a_idx if a_idx is not None else out, scale if scale is not None else out,
        b, b.stride(0), b_idx if b_idx is not None else out,
        out, se, s_m, s_n, dbias if dbias is not None else out, dbias.stride(0) if dbias is not None else 0,
        route.offsets, m, n,
    )  # fmt: skip
    consts = dict(
        HAS_A_IDX=a_idx is not None, HAS_SCALE=scale is not None, HAS_B_IDX=b_idx is not None,
        HAS_DBIAS=dbias is not None, PREC=_precision(b),
    )  # fmt: skip
    rows, experts = _rows_bucket(route), _experts(route)
    sizes = dict(M=m, N=n, ROWS=rows, E=experts, dtype=_dtype(b), out="mn" if s_n == 1 else "nm")

    def candidates():
        return tuning.wgrad_candidates(tuning.WgradShape(m, n, rows, experts, a.element_size()))

    return WGRAD_TUNER.launch(grid, args, consts, sizes, candidates, a.device)
