"""Per-token log-probs together with the entropy of each token's next-token distribution, through the head tile
by tile: what the RL losses need for an entropy mask or an entropy bonus.

Cross entropy alone gives ``log p(target)``; the entropy ``H = -sum_v p_v log p_v`` needs the whole row, and its
gradient ``dH/dz_v = -p_v (log p_v + H)`` too. Both come from the RL head
(:func:`liger_registry.kernels.fused_linear_logprobs`): one pass over each logits tile computes them, the backward
recomputes each tile, so one tile of logits exists at a time (Triton kernels on CUDA, PyTorch on CPU). Tokens whose
target is ``ignore_index`` never reach the head. The tile budget is the chunk budget's (``max_chunk_mib``, or the
chunk FLCE plans for ``chunk_mem_const``, FLCE's default without either). ``accum_dtype`` has no effect
here: the weight gradient is one GEMM per vocabulary slab over every token (an fp32 accumulator beyond 32768).
"""

from __future__ import annotations

import torch

from liger_registry.kernels import flce_plan, fused_linear_logprobs

from .head_options import HeadOptions
from .logprobs import TokenLogProbs, _check, _options


def _tile_mib(options: HeadOptions, n: int, h: int, v: int, dtype: torch.dtype) -> float:
    """The head's tile budget: ``max_chunk_mib`` as is, else the bytes of the token chunk FLCE plans for
    ``chunk_mem_const`` (its default budget without one)."""
    if options.max_chunk_mib is not None:
        return float(options.max_chunk_mib)
    plan = flce_plan(max(n, 1), h, v, chunk_mem_const=options.chunk_mem_const, strategy="tokens", dtype=dtype)
    return max(plan.chunk_tokens, 1) * v * dtype.itemsize / 2**20


def token_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    options: HeadOptions | None = None,
    **head_options,
) -> tuple[TokenLogProbs, torch.Tensor]:
    """:func:`token_log_probs` and the entropy [B, T] (fp32, 0 where masked) of each counted token's next-token
    distribution ``softmax(softcap((hidden @ weight.T + bias) * scale) / temperature)``, both differentiable in
    hidden, weight and bias, never materialising [B*T, V]."""
    options = _options(options, head_options)
    _check(hidden, weight, target, bias)
    target = target.to(device=hidden.device, dtype=torch.int64)
    mask = target != options.ignore_index
    flat = mask.reshape(-1)
    rows = hidden.reshape(-1, hidden.shape[-1])[flat]
    n, v = rows.shape[0], weight.shape[0]
    out = fused_linear_logprobs(
        rows, weight, target.reshape(-1)[flat], bias, temperature=options.temperature, softcap=options.softcap,
        logit_scale=options.logit_scale, outputs=("log_probs", "entropy"),
        max_tile_mib=_tile_mib(options, n, rows.shape[1], v, rows.dtype),
    )  # fmt: skip
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device)
    return TokenLogProbs(zeros.masked_scatter(mask, out.log_probs), mask), zeros.masked_scatter(
        mask, out.entropy
    )
