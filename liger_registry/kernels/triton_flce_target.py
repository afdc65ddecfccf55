"""Triton kernel of the FLCE exact target logit (``flce_target.target_logits_torch``'s contract): one program
per row, the dot of the hidden row and its target's weight row accumulated in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import tanh

BLOCK_H = 1024


@triton.jit
def _target_logit_kernel(
    X,
    stride_x,
    W,
    stride_w,
    B,
    Y,
    OUT,
    h,
    ignore_index,
    softcap,
    logit_scale,
    HAS_BIAS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(Y + row)
    y = tl.where(y == ignore_index, 0, y).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, h, BLOCK):
        cols = start + offs
        mask = cols < h
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + y * stride_w + cols, mask=mask, other=0.0).to(tl.float32)
        acc += x * w
    z = tl.sum(acc, 0)
    if HAS_BIAS:
        z += tl.load(B + y).to(tl.float32)
    z = z * logit_scale
    if HAS_SOFTCAP:
        z = softcap * tanh(z / softcap)
    tl.store(OUT + row, z)


@torch.no_grad()
def target_logits_triton(hidden, weight, target, bias, *, ignore_index, softcap, logit_scale) -> torch.Tensor:
    n, h = hidden.shape
    out = torch.empty(n, dtype=torch.float32, device=hidden.device)
    if n == 0:
        return out
    hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    _target_logit_kernel[(n,)](
        hidden,
        hidden.stride(0),
        weight,
        weight.stride(0),
        bias if bias is not None else out,
        target.contiguous(),
        out,
        h,
        ignore_index,
        float(softcap) if softcap is not None else 1.0,
        float(logit_scale),
        HAS_BIAS=bias is not None,
        HAS_SOFTCAP=softcap is not None,
        BLOCK=min(BLOCK_H, triton.next_power_of_2(max(h, 16))),
        num_warps=4,
    )
    return out
