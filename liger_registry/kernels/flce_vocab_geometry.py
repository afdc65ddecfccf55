"""Chunk geometry of the FLCE vocabulary strategy: the columns of each pass and where their logits live.

Why a scratch region: the weight gradient dW [V, H] is allocated before pass 1 and each of its rows is written
once, in pass 2. Until a row is written its memory holds nothing, so the logits of a chunk may live there as
long as they do not overlap the dW rows their own pass writes. That memory is the output's, not extra: peak
memory stays that of the budget buffer, while the chunks grow from ~H columns (the C=1 budget) to a large
share of V. Fewer, larger chunks mean fewer launches (the loop was host- and gap-bound at 2-4k tokens), one
fp32 dX accumulator pass per chunk instead of ~V/H of them, and pass 1's last chunk, made as wide as the
memory allows, kept for pass 2 without a second logits GEMM.

With ``N`` rows, the logits of ``w`` columns take ``N w`` elements from the front of dW's storage; pass-2
chunk ``[s, s + w)`` writes dW rows at ``[s H, (s + w) H)``, so it may use the scratch when ``N w <= s H``:

* pass 1: the columns ``[0, V - r)`` in even chunks of at most ``V H / N`` columns, then the last chunk
  ``[V - r, V)`` with ``r = V H / (N + H)`` (the widest that does not overlap its own dW rows);
* pass 2 (descending): ``[V - r, V)`` reusing pass 1's logits, then from ``e = V - r`` down the chunks
  ``[s, e)`` with ``s = N e / (N + H)`` (each ``(N + H) / N`` times narrower than the columns left) while they
  are wider than the budget buffer, and the rest in budget-buffer chunks.

Without a weight gradient (a frozen head) or when ``r`` is no wider than the budget buffer (many rows), the
geometry is the plain one: even budget-buffer chunks, pass 2 reusing the last.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class VocabChunk(NamedTuple):
    """Columns ``[start, start + width)``; ``scratch``: logits at the front of dW's storage, else in the budget
    buffer; ``reuse`` (pass 2 only): the logits of pass 1's last chunk are still there (no logits GEMM)."""

    start: int
    width: int
    scratch: bool = False
    reuse: bool = False


class VocabGeometry(NamedTuple):
    """Pass 1 in ascending, pass 2 in descending column order; ``buffer_cols`` the budget buffer's width in use
    (0: every chunk in the scratch)."""

    pass1: tuple[VocabChunk, ...]
    pass2: tuple[VocabChunk, ...]

    @property
    def buffer_cols(self) -> int:
        return max((c.width for c in (*self.pass1, *self.pass2) if not c.scratch), default=0)

    @property
    def scratch(self) -> bool:
        return any(c.scratch for c in self.pass1)


def _even(start: int, stop: int, widest: int, multiple: int) -> list[tuple[int, int]]:
    """``[start, stop)`` in the fewest even chunks of at most ``widest`` columns (widths a multiple of
    ``multiple`` where that stays within ``widest``), ascending."""
    total = stop - start
    if total <= 0:
        return []
    k = math.ceil(total / widest)
    width = min(math.ceil(math.ceil(total / k) / multiple) * multiple, widest)
    return [(s, min(width, stop - s)) for s in range(start, stop, width)]


def plain_geometry(v: int, width: int) -> VocabGeometry:
    """Chunks of ``width`` columns (the planner's even split) in the budget buffer; pass 2 reuses pass 1's last."""
    chunks = [VocabChunk(s, min(width, v - s)) for s in range(0, v, max(width, 1))]
    pass2 = [c._replace(reuse=i == 0) for i, c in enumerate(reversed(chunks))]
    return VocabGeometry(tuple(chunks), tuple(pass2))


def vocab_geometry(n: int, h: int, v: int, width: int, scratch: bool, multiple: int = 128) -> VocabGeometry:
    """The chunks of a call with ``n`` rows, hidden ``h``, ``v`` columns, a budget buffer of ``width`` columns;
    ``scratch``: dW [V, H] (same dtype as the logits) is computed and may hold logits (see the module doc)."""
    width = max(min(width, v), 1)
    if not scratch or n <= 0 or h <= 0:
        return plain_geometry(v, width)
    last = min(v * h // (n + h) // multiple * multiple, v)
    if last <= width:
        return plain_geometry(v, width)
    head_cap = max(v * h // n // multiple * multiple, multiple)
    pass1 = [VocabChunk(s, w, True) for s, w in _even(0, v - last, head_cap, multiple)]
    pass1.append(VocabChunk(v - last, last, True))
    pass2 = [VocabChunk(v - last, last, True, True)]
    end = v - last
    while end > 0:
        start = math.ceil(math.ceil(n * end / (n + h)) / multiple) * multiple
        if end - start < width:
            break
        pass2.append(VocabChunk(start, end - start, True))
        end = start
    pass2 += [VocabChunk(s, w) for s, w in reversed(_even(0, end, width, multiple))]
    return VocabGeometry(tuple(pass1), tuple(pass2))


def fits(geometry: VocabGeometry, n: int, h: int, v: int) -> bool:
    """The scratch invariants: every scratch chunk's logits fit in dW's storage and, in pass 2, end before the dW
    rows that chunk writes; the two passes cover the columns exactly once each (used by the tests)."""
    for chunks in (geometry.pass1, geometry.pass2):
        cols = sorted((c.start, c.width) for c in chunks)
        ends = [a + w for a, w in cols]
        if not cols or cols[0][0] != 0 or ends[-1] != v or ends[:-1] != [a for a, _ in cols[1:]]:
            return False
    if any(c.scratch and n * c.width > v * h for c in geometry.pass1):
        return False
    return all(not c.scratch or n * c.width <= c.start * h for c in geometry.pass2)
