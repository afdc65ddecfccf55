"""Triton SwiGLU (silu(a) * b) and GeGLU (gelu_tanh(a) * b): elementwise forward and backward.

Rounded as the modules they replace round (``act_fn(gate) * up`` in transformers' MLPs): the activation is
computed in fp32 and rounded to the gate's dtype, then multiplied by ``up`` and rounded to the output dtype. The
backward is the gradient of that: d up = dc * the rounded activation, d gate = dc * up * act'(gate)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import tanh

_K = 0.7978845608028654  # sqrt(2 / pi)


@triton.jit
def _glu_fwd_kernel(A, B, C, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    if KIND == 0:
        act = a * tl.sigmoid(a)
    else:
        t = tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))
        act = 0.5 * a * (1.0 + t)
    act = act.to(A.dtype.element_ty).to(tl.float32)
    tl.store(C + offs, (act * b).to(C.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(DC, A, B, DA, DB, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dc = tl.load(DC + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
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
    tl.store(DA + offs, (dc * b * dact).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dc * act).to(DB.dtype.element_ty), mask=mask)


BLOCK = 1024


def glu_fwd(a: torch.Tensor, b: torch.Tensor, kind: int) -> torch.Tensor:
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty(a.shape, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    n = a.numel()
    if n:
        _glu_fwd_kernel[(triton.cdiv(n, BLOCK),)](a, b, c, n, KIND=kind, BLOCK=BLOCK, num_warps=4)
    return c


def glu_bwd(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kind: int):
    dc, a, b = dc.contiguous(), a.contiguous(), b.contiguous()
    da = torch.empty_like(a)
    db = torch.empty_like(b)
    n = a.numel()
    if n:
        _glu_bwd_kernel[(triton.cdiv(n, BLOCK),)](dc, a, b, da, db, n, KIND=kind, BLOCK=BLOCK, num_warps=4)
    return da, db
