"""The routing table of one experts call: the (token, slot) pairs sorted by expert, and the row blocks.

* :func:`route` returns a :class:`Route` (``src``, ``dest``, ``offsets``, ``blocks``, ``block_m``) that the
  grouped GEMMs run over.
* Built from tensor ops of static shape with no host synchronisation (no ``.item()``, no data-dependent sizes):
  the number of row blocks is bounded by ``cdiv(S, block_m) + E`` (each expert wastes at most one partial block),
  the blocks beyond the real ones are marked idle, so the same table serves eager, CUDA graphs and
  torch.compile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..triton_utils import cdiv


class Route(NamedTuple):
    """``src[s]``: the token of sorted row ``s``; ``dest[s]``: its (token, slot) index in ``top_k_index.view(-1)``;
    ``offsets`` [E + 1]: each expert's first sorted row; ``blocks`` [3, n_blocks]: each row block's expert
    (-1 when idle), first row and end row; ``block_m``: rows per block."""

    src: torch.Tensor
    dest: torch.Tensor
    offsets: torch.Tensor
    blocks: torch.Tensor
    block_m: int


def block_rows(n_rows: int, n_experts: int) -> int:
    """Rows per block of the grouped GEMMs: 64 when experts get few rows on average, else 128."""
    return 64 if n_rows < 128 * n_experts else 128


def route(top_k_index: torch.Tensor, n_experts: int, block_m: int | None = None) -> Route:
    """The table for ``top_k_index`` [T, K] (expert ids in ``[0, n_experts)``)."""
    ids = top_k_index.reshape(-1)
    n_rows = ids.numel()
    block_m = block_m or block_rows(n_rows, n_experts)
    _, order = torch.sort(ids, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, ids.long(), torch.ones_like(ids, dtype=torch.int32))
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    offsets = torch.cat([ends.new_zeros(1), ends])
    n_expert_blocks = (counts + block_m - 1) // block_m
    block_ends = torch.cumsum(n_expert_blocks, 0, dtype=torch.int32)
    n_blocks = cdiv(n_rows, block_m) + n_experts
    block = torch.arange(n_blocks, dtype=torch.int32, device=ids.device)
    expert = torch.searchsorted(block_ends, block, right=True, out_int32=True)
    live = expert < n_experts
    e = expert.clamp(max=n_experts - 1).long()
    first = offsets[e] + (block - (block_ends[e] - n_expert_blocks[e])) * block_m
    blocks = torch.stack([torch.where(live, expert, -1), first, ends[e]]).to(torch.int32)
    src = (order // top_k_index.shape[-1]).to(torch.int32)
    return Route(src, order.to(torch.int32), offsets, blocks.contiguous(), block_m)
