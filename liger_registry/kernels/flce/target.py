"""Exact target logit of each row for FLCE, and the correction of the row's log-sum-exp for it.

* ``target_logits``: ``z_y = <x_n, W[y_n]> (+ b[y_n])`` accumulated in fp32, then ``logit_scale`` and
  ``softcap`` (``target_logits_torch`` or the Triton kernel ``target_logits_triton``, one program per row).
* ``corrected_lse`` swaps the target's term of the row's sum-exp: ``d' = d - exp(z_y16 - m) + exp(z_y - m)``.
* ``chunk_target_probs`` / ``target_probs_from_lse``: the target probabilities token scaling weighs each row's
  loss with.
* Why: 16-bit logits round ``z_y`` by up to ~0.03 at ``z_y ~ 10`` (bf16), which on confident rows puts the loss
  ~1e-4 relative off float64; both strategies keep their 16-bit logits buffer and use this fp32 ``z_y``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ce.reference import corrected_lse, transform_logits
from ..triton_utils import tanh

ROWS_PER_STEP = 1024  # the PyTorch path upcasts this many [H] row pairs at a time (bounded fp32 temporaries)


def needs_exact_target(hidden: torch.Tensor) -> bool:
    """Only 16-bit logits round the target logit enough to matter."""
    return hidden.element_size() < 4


@torch.no_grad()
def target_logits_torch(hidden, weight, target, bias, *, ignore_index, softcap, logit_scale) -> torch.Tensor:
    """fp32 [N]: the transformed logit of each row's target (0 before the transform on ignored rows)."""
    safe = torch.where(target != ignore_index, target, torch.zeros_like(target))
    raw = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for s in range(0, hidden.shape[0], ROWS_PER_STEP):
        idx = safe[s : s + ROWS_PER_STEP]
        raw[s : s + ROWS_PER_STEP] = (hidden[s : s + ROWS_PER_STEP].float() * weight[idx].float()).sum(-1)
    if bias is not None:
        raw += bias.float()[safe]
    return transform_logits(raw, softcap, logit_scale)


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


def target_logits(hidden, weight, target, bias, opts, backend: str) -> torch.Tensor:
    """:func:`target_logits_torch` or its Triton kernel, by the call's decided backend."""
    fn = target_logits_triton if backend == "triton" else target_logits_torch
    return fn(
        hidden,
        weight,
        target,
        bias,
        ignore_index=opts.ignore_index,
        softcap=opts.softcap,
        logit_scale=opts.logit_scale,
    )


# token scaling (liger's ``use_token_scaling``): each token's loss times ``p_y``, the detached softmax
# probability of its target, as per-row factors that scale a row's loss terms and its gradient
SCALING_ROWS_PER_STEP = (
    256  # rows of fp32 logits upcast at a time: bounds the temporary beside the logits buffer
)


@torch.no_grad()
def chunk_target_probs(buf: torch.Tensor, target: torch.Tensor, opts, target_logit=None) -> torch.Tensor:
    """fp32 [rows]: ``p_y`` of each row of a raw logits chunk (0 on ignored rows), read before the row kernel
    overwrites the chunk; ``target_logit`` (16-bit logits, :func:`target_logits`) is the exact transformed z_y."""
    probs = torch.zeros(buf.shape[0], dtype=torch.float32, device=buf.device)
    for s in range(0, buf.shape[0], SCALING_ROWS_PER_STEP):
        e = min(s + SCALING_ROWS_PER_STEP, buf.shape[0])
        z = transform_logits(buf[s:e], opts.softcap, opts.logit_scale)
        valid = target[s:e] != opts.ignore_index
        safe = torch.where(valid, target[s:e], torch.zeros_like(target[s:e]))
        lse = torch.logsumexp(z, dim=-1)
        z_y = z.gather(1, safe[:, None]).squeeze(1)
        if target_logit is not None:
            lse = corrected_lse(lse, z_y, target_logit[s:e])
            z_y = target_logit[s:e]
        probs[s:e] = torch.where(valid, torch.exp(z_y - lse), torch.zeros_like(lse))
    return probs


def target_probs_from_lse(lse: torch.Tensor, z_y: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """fp32 [N]: ``p_y = exp(z_y - lse)`` on valid rows, 0 on ignored rows (the vocabulary strategy's rows)."""
    valid = target != ignore_index
    return torch.where(valid, torch.exp(z_y - lse), torch.zeros_like(lse))


def with_row_factor(row_grad: torch.Tensor | None, factor: torch.Tensor) -> torch.Tensor:
    """The per-row gradient factor of the row kernel, times ``factor``."""
    return factor if row_grad is None else factor * row_grad.to(torch.float32)
