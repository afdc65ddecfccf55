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

With no more rows than the hidden size (``N <= H``: 2-4k tokens per micro-batch on a 4k-wide model) every
chunk's logits can be kept from pass 1 to pass 2, so pass 2 runs no logits GEMM at all (:func:`kept_geometry`):
the first chunk ``[0, w0)`` (``w0`` the budget buffer's width) stays in the buffer, and each later chunk
``[s, e)`` lies in dW's storage right after the logits of the columns before it, at ``N (s - w0)``, which ends
below its own dW rows when ``N (e - w0) <= s H``: widths grow by ``H / N`` per chunk. Pass 2 (descending) writes
each chunk's dW rows above the logits still to be read. At N = H the widths stop growing (~V / w0 chunks). The
caller chooses it by the cost model (``keep``, :func:`cost.keeps_every_chunk`; NOTES.md, session 6, has how
it compared on the H200). It is built up to KEPT_MAX_CHUNKS chunks.

Without a weight gradient (a frozen head) or when ``r`` is no wider than the budget buffer (many rows), the
geometry is the plain one: even budget-buffer chunks, pass 2 reusing the last.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class VocabChunk(NamedTuple):
    """Columns ``[start, start + width)``; ``scratch``: logits in dW's storage from element ``offset`` on, else at
    the front of the budget buffer; ``reuse`` (pass 2 only): pass 1 left this chunk's logits there (no logits
    GEMM)."""

    start: int
    width: int
    scratch: bool = False
    reuse: bool = False
    offset: int = 0


class VocabGeometry(NamedTuple):
    """Pass 1 in ascending, pass 2 in descending column order; ``buffer_cols`` the budget buffer's width in use
    (0: every chunk in the scratch)."""

    pass1: tuple[VocabChunk, ...]
    pass2: tuple[VocabChunk, ...]

    @property
    def buffer_cols(self) -> int:
        # no max(..., default=): dynamo of torch 2.11 graph-breaks on it, and the planner runs under compile
        return max([0, *(c.width for c in (*self.pass1, *self.pass2) if not c.scratch)])

    @property
    def scratch(self) -> bool:
        return any(c.scratch for c in self.pass1)

    @property
    def recomputed(self) -> int:
        """Columns whose logits pass 2 computes again."""
        return sum(c.width for c in self.pass2 if not c.reuse)


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


# the kept geometry is built up to this many chunks (beyond the counts NOTES.md's session 6 measured, launches
# and the fp32 dX accumulator's pass per chunk are untested against the logits GEMMs it saves)
KEPT_MAX_CHUNKS = 64


def kept_geometry(n: int, h: int, v: int, width: int, multiple: int = 128) -> VocabGeometry | None:
    """Every chunk's logits kept from pass 1 to pass 2 (``N <= H``, see the module doc); None when it does not
    apply or needs more than KEPT_MAX_CHUNKS chunks."""
    if n <= 0 or n > h or width >= v:
        return None
    chunks = [VocabChunk(0, width)]
    start = width
    while start < v:
        end = min(width + h * start // n, v)
        w = end - start if end == v else (end - start) // multiple * multiple
        if w <= 0 or len(chunks) >= KEPT_MAX_CHUNKS:
            return None
        chunks.append(VocabChunk(start, w, True, offset=n * (start - width)))
        start += w
    pass2 = tuple(c._replace(reuse=True) for c in reversed(chunks))
    return VocabGeometry(tuple(chunks), pass2)


def vocab_geometry(
    n: int, h: int, v: int, width: int, scratch: bool, multiple: int = 128, keep: bool = True
) -> VocabGeometry:
    """The chunks of a call with ``n`` rows, hidden ``h``, ``v`` columns, a budget buffer of ``width`` columns;
    ``scratch``: dW [V, H] (same dtype as the logits) is computed and may hold logits (see the module doc);
    ``keep``: the kept geometry where it applies (False: only pass 1's last chunk kept)."""
    width = max(min(width, v), 1)
    if not scratch or n <= 0 or h <= 0:
        return plain_geometry(v, width)
    kept = kept_geometry(n, h, v, width, multiple) if keep else None
    if kept is not None:
        return kept
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


def _region(c: VocabChunk, n: int) -> tuple[int, int]:
    return c.offset, c.offset + n * c.width


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def fits(geometry: VocabGeometry, n: int, h: int, v: int) -> bool:
    """The invariants (used by the tests): the two passes cover the columns exactly once each; every scratch chunk's
    logits lie in dW's storage and, in pass 2, below the dW rows that chunk writes; logits that pass 2 reuses are
    not overwritten in between (by a later pass-1 chunk, by an earlier pass-2 chunk's recomputed logits or dW
    rows); pass 2 reuses only what pass 1 computed."""
    for chunks in (geometry.pass1, geometry.pass2):
        cols = sorted((c.start, c.width) for c in chunks)
        ends = [a + w for a, w in cols]
        if not cols or cols[0][0] != 0 or ends[-1] != v or ends[:-1] != [a for a, _ in cols[1:]]:
            return False
    if any(c.scratch and (c.offset < 0 or _region(c, n)[1] > v * h) for c in geometry.pass1):
        return False
    if any(c.scratch and _region(c, n)[1] > c.start * h for c in geometry.pass2):
        return False
    stored = {c.start: (i, c) for i, c in enumerate(geometry.pass1)}
    for j, c in enumerate(geometry.pass2):
        if not c.reuse:
            continue
        i, kept = stored.get(c.start, (None, None))
        if kept is None or kept != c._replace(reuse=False):
            return False
        later = geometry.pass1[i + 1 :]
        earlier = [e for e in geometry.pass2[:j] if not e.reuse]
        same_place = [o for o in (*later, *earlier) if o.scratch == c.scratch]
        if any(_overlap(_region(o, n), _region(c, n)) for o in same_place):
            return False
        if c.scratch and any(
            _overlap((e.start * h, (e.start + e.width) * h), _region(c, n)) for e in geometry.pass2[:j]
        ):
            return False
    return True
