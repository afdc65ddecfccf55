"""Triton gated activations and relu², forward and backward, elementwise in fp32, and their launchers.

* ``launch_glu_fwd`` / ``launch_glu_bwd``: SwiGLU (``silu(a) * b``) and GeGLU (``gelu_tanh(a) * b``) on separate
  gate and up tensors, optionally with Falcon-H1's multipliers: ``act(a * gate_multiplier) * b *
  down_multiplier`` (compile-time switches ``GATE_SCALED`` / ``DOWN_SCALED``: the default 1.0 compiles without).
* ``launch_gate_up_fwd`` / ``launch_gate_up_bwd``: the same read straight from a fused gate_up projection (no
  split copy), over [gate | up] halves or GPT-OSS's interleaved (gate, up) pairs; the backward writes one
  gradient shaped like gate_up. ``_act_and_grad`` is shared with the MoE kernels.
* ``launch_relu_squared``: relu² or its gradient, elementwise.
* Rounded as the modules they replace round: the activation in fp32 rounded to the gate's dtype, then times
  ``up`` rounded to the output dtype; each op of GPT-OSS's gate; relu² once; a multiplier rounds to the tensor's
  dtype as that eager multiply does. The backward is the gradient of that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_utils import contiguous_rows, tanh

SILU, GELU_TANH, CLAMPED, LIMITED = 0, 1, 2, 3  # the kernels' KIND
BLOCK = 1024  # elements per program of the elementwise kernels (columns per program of the gate_up kernels)


@triton.jit
def _scaled_gate(A, offs, mask, gate_mul, GATE_SCALED: tl.constexpr):
    """The gate in fp32, times ``gate_mul`` rounded to the gate's dtype (``gate * m`` in the gate's dtype)."""
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    if GATE_SCALED:
        a = (a * gate_mul).to(A.dtype.element_ty).to(tl.float32)
    return a


@triton.jit
def _glu_fwd_kernel(
    A, B, C, n, gate_mul, down_mul,
    KIND: tl.constexpr, GATE_SCALED: tl.constexpr, DOWN_SCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = _scaled_gate(A, offs, mask, gate_mul, GATE_SCALED)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    if KIND == 0:
        act = a * tl.sigmoid(a)
    else:
        t = tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))
        act = 0.5 * a * (1.0 + t)
    act = act.to(A.dtype.element_ty).to(tl.float32)
    y = act * b
    if DOWN_SCALED:  # the product rounds first, then the eager ``out * m``
        y = y.to(C.dtype.element_ty).to(tl.float32) * down_mul
    tl.store(C + offs, y.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(
    DC, A, B, DA, DB, n, gate_mul, down_mul,
    KIND: tl.constexpr, GATE_SCALED: tl.constexpr, DOWN_SCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dc = tl.load(DC + offs, mask=mask, other=0.0).to(tl.float32)
    if DOWN_SCALED:
        dc = dc * down_mul
    a = _scaled_gate(A, offs, mask, gate_mul, GATE_SCALED)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    if KIND == 0:
        sig = tl.sigmoid(a)
        act = a * sig
        dact = sig * (1.0 + a * (1.0 - sig))
    else:
        inner = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        t = tanh(inner)
        act = 0.5 * a * (1.0 + t)
        dact = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * a * a)
    act = act.to(A.dtype.element_ty).to(tl.float32)
    da = dc * b * dact
    if GATE_SCALED:
        da = da * gate_mul
    tl.store(DA + offs, da.to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dc * act).to(DB.dtype.element_ty), mask=mask)


def _multipliers(gate_multiplier: float, down_multiplier: float) -> dict:
    """The kernels' multiplier arguments; a multiplier of 1.0 switches its multiply off at compile time."""
    return dict(
        gate_mul=float(gate_multiplier),
        down_mul=float(down_multiplier),
        GATE_SCALED=gate_multiplier != 1.0,
        DOWN_SCALED=down_multiplier != 1.0,
    )


def launch_glu_fwd(
    a: torch.Tensor, b: torch.Tensor, kind: int, gate_multiplier: float = 1.0, down_multiplier: float = 1.0
) -> torch.Tensor:
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty(a.shape, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    n = a.numel()
    if n:
        _glu_fwd_kernel[(triton.cdiv(n, BLOCK),)](
            a, b, c, n, KIND=kind, BLOCK=BLOCK, num_warps=4, **_multipliers(gate_multiplier, down_multiplier)
        )
    return c


def launch_glu_bwd(
    dc: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    kind: int,
    gate_multiplier: float = 1.0,
    down_multiplier: float = 1.0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """``(da, db)``; ``out``: where to write them (contiguous, a's and b's shapes; may be ``(a, b)`` themselves:
    each element is read before it is written)."""
    dc, a, b = dc.contiguous(), a.contiguous(), b.contiguous()
    da, db = out if out is not None else (torch.empty_like(a), torch.empty_like(b))
    n = a.numel()
    if n:
        _glu_bwd_kernel[(triton.cdiv(n, BLOCK),)](
            dc, a, b, da, db, n, KIND=kind, BLOCK=BLOCK, num_warps=4,
            **_multipliers(gate_multiplier, down_multiplier),
        )  # fmt: skip
    return da, db


_KINDS = {"swiglu": SILU, "geglu": GELU_TANH, "clamped_swiglu": CLAMPED, "limited_swiglu": LIMITED}


@triton.jit
def _round(x, DT: tl.constexpr):
    """``x`` rounded to ``DT`` (the tensors' dtype) and back to fp32: one eager op's rounding."""
    return x.to(DT).to(tl.float32)


@triton.jit
def _act_and_grad(a, b, limit, alpha, KIND: tl.constexpr, DT: tl.constexpr):
    """The gated value f(a, b) and its partial derivatives (d/da, d/db), in fp32, rounded to ``DT`` where the
    family's eager code rounds: after the activation (``act_fn(gate) * up``); after every op of GPT-OSS's gate.
    The derivatives are those of that computation (each rounding's derivative taken as 1), at its rounded values.
    """
    if KIND == 0:
        sig = tl.sigmoid(a)
        act = _round(a * sig, DT)
        y = act * b
        da = b * sig * (1.0 + a * (1.0 - sig))
        db = act
    elif KIND == 1:
        t = tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))
        act = _round(0.5 * a * (1.0 + t), DT)
        dact = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * a * a)
        y = act * b
        da = b * dact
        db = act
    elif (
        KIND == 2
    ):  # GPT-OSS: gate clamped above, up clamped both ways (gradients pass where the clamp is inactive)
        g = _round(tl.minimum(a, limit), DT)
        u = _round(tl.minimum(tl.maximum(b, -limit), limit), DT)
        sig = _round(tl.sigmoid(_round(g * alpha, DT)), DT)
        glu = _round(g * sig, DT)
        u1 = _round(u + 1.0, DT)
        y = u1 * glu
        da = tl.where(a <= limit, u1 * (sig + g * alpha * sig * (1.0 - sig)), 0.0)
        db = tl.where((b >= -limit) & (b <= limit), glu, 0.0)
    else:  # DeepSeek-V4: silu(gate) * up with gate clamped above and up both ways, a [gate | up] split
        g = _round(tl.minimum(a, limit), DT)
        u = _round(tl.minimum(tl.maximum(b, -limit), limit), DT)
        sig = tl.sigmoid(g)
        act = _round(g * sig, DT)
        y = act * u
        da = tl.where(a <= limit, u * sig * (1.0 + g * (1.0 - sig)), 0.0)
        db = tl.where((b >= -limit) & (b <= limit), act, 0.0)
    return y, da, db


@triton.jit
def _gate_up_fwd_kernel(
    GU, stride_gu, OUT, stride_o, n_cols, limit, alpha,
    UP_OFF: tl.constexpr, STEP: tl.constexpr, KIND: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    src = GU + row * stride_gu + cols * STEP
    a = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + UP_OFF, mask=mask, other=0.0).to(tl.float32)
    y, _, _ = _act_and_grad(a, b, limit, alpha, KIND, GU.dtype.element_ty)
    tl.store(OUT + row * stride_o + cols, y.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _gate_up_bwd_kernel(
    DOUT, stride_do, GU, stride_gu, DGU, stride_dgu, n_cols, limit, alpha,
    UP_OFF: tl.constexpr, STEP: tl.constexpr, KIND: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    src = GU + row * stride_gu + cols * STEP
    a = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + UP_OFF, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DOUT + row * stride_do + cols, mask=mask, other=0.0).to(tl.float32)
    _, da, db = _act_and_grad(a, b, limit, alpha, KIND, GU.dtype.element_ty)
    dst = DGU + row * stride_dgu + cols * STEP
    tl.store(dst, (dy * da).to(DGU.dtype.element_ty), mask=mask)
    tl.store(dst + UP_OFF, (dy * db).to(DGU.dtype.element_ty), mask=mask)


def _geometry(gate_up: torch.Tensor, kind: str):
    gu = contiguous_rows(gate_up)
    n_rows, width = gu.shape
    n_cols = width // 2
    interleaved = kind == "clamped_swiglu"
    up_off, step = (1, 2) if interleaved else (n_cols, 1)
    block = min(BLOCK, triton.next_power_of_2(max(n_cols, 16)))
    return gu, n_rows, n_cols, up_off, step, block


def launch_gate_up_fwd(
    gate_up: torch.Tensor, kind: str, limit: float = 0.0, alpha: float = 0.0
) -> torch.Tensor:
    """act(gate) * up of a [..., 2I] gate_up tensor, result [..., I]; ``clamped_swiglu`` reads interleaved
    (gate, up) pairs, the others a [gate | up] split."""
    gu, n_rows, n_cols, up_off, step, block = _geometry(gate_up, kind)
    out = torch.empty((n_rows, n_cols), dtype=gate_up.dtype, device=gate_up.device)
    if out.numel():
        grid = (n_rows, triton.cdiv(n_cols, block))
        _gate_up_fwd_kernel[grid](
            gu, gu.stride(0), out, out.stride(0), n_cols, float(limit), float(alpha),
            UP_OFF=up_off, STEP=step, KIND=_KINDS[kind], BLOCK=block, num_warps=4,
        )  # fmt: skip
    return out.view(*gate_up.shape[:-1], n_cols)


def launch_gate_up_bwd(
    dout: torch.Tensor, gate_up: torch.Tensor, kind: str, limit: float = 0.0, alpha: float = 0.0
):
    """The gradient of :func:`gate_up_fwd` with respect to gate_up, one [..., 2I] tensor."""
    gu, n_rows, n_cols, up_off, step, block = _geometry(gate_up, kind)
    do = contiguous_rows(dout)
    dgu = torch.empty((n_rows, 2 * n_cols), dtype=gate_up.dtype, device=gate_up.device)
    if dgu.numel():
        grid = (n_rows, triton.cdiv(n_cols, block))
        _gate_up_bwd_kernel[grid](
            do, do.stride(0), gu, gu.stride(0), dgu, dgu.stride(0), n_cols, float(limit), float(alpha),
            UP_OFF=up_off, STEP=step, KIND=_KINDS[kind], BLOCK=block, num_warps=4,
        )  # fmt: skip
    return dgu.view(gate_up.shape)


@triton.jit
def _relu_sq_kernel(X, DY, OUT, n, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = tl.maximum(tl.load(X + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
    if BACKWARD:
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        y = 2.0 * r * dy
    else:
        y = r * r
    tl.store(OUT + offs, y.to(OUT.dtype.element_ty), mask=mask)


def launch_relu_squared(x: torch.Tensor, dy: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(x) ** 2`` or, given ``dy``, its gradient ``2 * relu(x) * dy``."""
    x = x.contiguous()
    dy = x if dy is None else dy.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _relu_sq_kernel[(triton.cdiv(n, BLOCK),)](
            x, dy, out, n, BACKWARD=dy is not x, BLOCK=BLOCK, num_warps=4
        )
    return out
