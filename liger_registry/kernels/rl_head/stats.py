"""Per-token running statistics of the RL head: what one pass over the vocabulary keeps, and the outputs made
from them.

* ``OUTPUTS``: the per-token outputs, in their order; ``Flags`` says which a call computes (``log_probs``
  always); ``flags_of`` / ``Flags.mask`` convert between the names and the custom ops' integer mask.
* ``RowState``: per token (fp32 unless said), with ``m`` the running max of ``z`` and ``e = exp(z - m)``:
  ``d = sum e``, ``xs = sum e z``, ``sq = sum e^2`` (relative to ``m^2``), ``zs = sum z``, ``arg`` (int64) the
  first column holding the max, ``zt`` the target's ``z``.
* ``finish``: ``log p(target) = zt - log Z`` with ``log Z = m + log d``; entropy ``log Z - xs / d``;
  ``log sum_v p_v^2 = log sq - 2 log d``; mean logit ``zs / V``; ``is_top1 = arg == target``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch

OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


class Flags(NamedTuple):
    """Which optional outputs a call computes."""

    entropy: bool = False
    log_sum_sq_probs: bool = False
    mean_logits: bool = False
    is_top1: bool = False

    @property
    def mask(self) -> int:
        return sum(1 << i for i, on in enumerate(self) if on)

    @classmethod
    def from_mask(cls, mask: int) -> Flags:
        return cls(*(bool(mask >> i & 1) for i in range(len(cls._fields))))


def flags_of(outputs: Iterable[str]) -> Flags:
    """The flags of a tuple of output names (a ValueError names an unknown one)."""
    names = tuple(outputs)
    unknown = sorted(set(names) - set(OUTPUTS))
    if unknown:
        raise ValueError(f"unknown outputs {unknown}; expected names among {list(OUTPUTS)}")
    return Flags(*(name in names for name in OUTPUTS[1:]))


class RowState(NamedTuple):
    m: torch.Tensor
    d: torch.Tensor
    xs: torch.Tensor
    sq: torch.Tensor
    zs: torch.Tensor
    arg: torch.Tensor
    zt: torch.Tensor


def new_state(n: int, device) -> RowState:
    f32 = {"dtype": torch.float32, "device": device}
    return RowState(
        torch.full((n,), float("-inf"), **f32),
        torch.zeros(n, **f32),
        torch.zeros(n, **f32),
        torch.zeros(n, **f32),
        torch.zeros(n, **f32),
        torch.zeros(n, dtype=torch.int64, device=device),
        torch.zeros(n, **f32),
    )


def with_exact_target(state: RowState, exact: torch.Tensor) -> RowState:
    """``state`` with the target's term of every sum taken at the exact (fp32) target logit instead of the 16-bit
    tile's: ``d - e16 + e`` with ``e16 = exp(zt16 - m)``, ``e = exp(zt - m)``, and so for ``xs``, ``sq``, ``zs``.
    Why: a 16-bit tile rounds ``z`` by up to ~0.03 at ``z ~ 10`` (bf16), which moves a confident row's log-prob
    by as much (docs/design/flce-layouts.md)."""
    e16, e = torch.exp(state.zt - state.m), torch.exp(exact - state.m)
    return state._replace(
        d=state.d - e16 + e,
        xs=state.xs - e16 * state.zt + e * exact,
        sq=state.sq - e16 * e16 + e * e,
        zs=state.zs - state.zt + exact,
        zt=exact,
    )


def finish(state: RowState, target: torch.Tensor, vocab: int, flags: Flags):
    """``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1, log_z)``; an output not asked for is an
    empty tensor of its own (a custom op's outputs may not alias each other)."""
    log_d = torch.log(state.d)
    log_z = state.m + log_d
    entropy = log_z - state.xs / state.d if flags.entropy else state.m.new_empty(0)
    log_sum_sq = torch.log(state.sq) - 2 * log_d if flags.log_sum_sq_probs else state.m.new_empty(0)
    mean = state.zs / vocab if flags.mean_logits else state.m.new_empty(0)
    top1 = state.arg == target if flags.is_top1 else torch.empty(0, dtype=torch.bool, device=state.m.device)
    return state.zt - log_z, entropy, log_sum_sq, mean, top1, log_z
