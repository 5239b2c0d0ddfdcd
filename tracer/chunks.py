"""A swapped struct buffer, cut into chunks of at most ``MESSAGE_ROWS`` rows for the flusher.

Why chunks: numpy asks the kernel for transparent huge pages for every array of 4 MiB or more
(``madvise(MADV_HUGEPAGE)``), and faulting in one 2 MiB huge page costs about 4.5 ms on this VM
(measured: 143 ms to touch a 64 MiB ``np.zeros`` array, 38 ms for the same size in 4 KiB pages)
-- with the GIL held, so a thread emitting meanwhile stalls for the whole fault. A flush of a
million-row buffer made 8 MiB column copies. Cut into chunks, every numpy temporary of a flush
stays under 512 KiB (64 Ki rows of 8 bytes), and each chunk is one IPC message with a GIL yield
after it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer.schema.storage import ARROW_POOL
from tracer.segments import MESSAGE_ROWS

_row_of = itemgetter(0)


def written_mask(seqs: np.ndarray, between: Callable[[], None], rows: int = MESSAGE_ROWS) -> np.ndarray:
    """``seqs != 0`` (the rows written), computed a chunk at a time (a strided 1M-row compare
    holds the GIL ~2 ms)."""
    keep = np.empty(len(seqs), bool)
    for start in range(0, len(seqs), rows):
        np.not_equal(seqs[start : start + rows], 0, out=keep[start : start + rows])
        between()
    return keep


def row_chunks(seqs: np.ndarray, keep: np.ndarray, torn: int, between: Callable[[], None],
               rows: int = MESSAGE_ROWS) -> Iterator[slice | np.ndarray]:
    """The kept rows in ``seq`` order, at most ``rows`` at a time: a ``slice`` of the buffer, or
    an array of row indices. ``seqs``: the buffer's seq column (a strided view); ``keep``: rows
    written; ``torn``: how many are not. Select a column's chunk with ``column[chunk]``, never
    the structured array itself (a 64 Ki-row structured fancy index takes ~3.3 ms)."""
    n = len(seqs)
    if _in_order(seqs, keep, rows, between):
        for start in range(0, n, rows):
            if not torn:
                yield slice(start, min(start + rows, n))
                continue
            pos = np.flatnonzero(keep[start : start + rows]) + start
            if len(pos):
                yield pos
        return
    # Several threads emitted and interleaved between taking a seq and a slot: one global order.
    # Arrow computes it in its own memory pool (no numpy huge pages), in small input pieces.
    starts = range(0, n, rows)
    idx = pa.chunked_array([pa.array(np.flatnonzero(keep[s : s + rows]) + s) for s in starts], pa.int64())
    between()
    kseq = pa.chunked_array([pa.array(seqs[s : s + rows][keep[s : s + rows]]) for s in starts], pa.int64())
    between()
    order = pc.take(idx, pc.sort_indices(kseq, memory_pool=ARROW_POOL), memory_pool=ARROW_POOL)
    between()
    for start in range(0, len(order), rows):
        yield order.slice(start, rows).to_numpy()


def positions(chunk: slice | np.ndarray) -> np.ndarray:
    """Row indices of a chunk from ``row_chunks``."""
    return np.arange(chunk.start, chunk.stop) if isinstance(chunk, slice) else chunk


def _in_order(seqs: np.ndarray, keep: np.ndarray, rows: int, between: Callable[[], None]) -> bool:
    prev = 0
    for start in range(0, len(seqs), rows):
        k = seqs[start : start + rows][keep[start : start + rows]]
        if len(k):
            if k[0] <= prev or not (k[1:] > k[:-1]).all():
                return False
            prev = k[-1]
        between()
    return True


class SideIndex:
    """Page ids of a buffer's rows, from its ``side`` list of ``(row, ids)``, looked up per chunk.
    ``side`` is appended in slot order, so it is sorted unless threads interleaved (then it is
    sorted here, once)."""

    def __init__(self, side: list, between: Callable[[], None], rows: int = 1 << 14):
        self.side = side
        prev = -1
        for start in range(0, len(side), rows):
            r = np.fromiter(map(_row_of, side[start : start + rows]), np.int64)
            if r[0] <= prev or not (r[1:] > r[:-1]).all():
                side.sort(key=_row_of)
                break
            prev = r[-1]
            between()

    def entries(self, pos: np.ndarray) -> list[tuple[int, object]]:
        """``(index in pos, ids)`` for the rows of ``pos`` that carry page ids."""
        if not self.side or not len(pos):
            return []
        lo = bisect_left(self.side, int(pos.min()), key=_row_of)
        hi = bisect_right(self.side, int(pos.max()), key=_row_of)
        if lo == hi:
            return []
        cand = self.side[lo:hi]
        want = np.fromiter(map(_row_of, cand), np.int64, len(cand))
        srt = np.argsort(pos, kind="stable")
        sorted_pos = pos[srt]
        at = np.minimum(np.searchsorted(sorted_pos, want), len(pos) - 1)
        found = np.flatnonzero(sorted_pos[at] == want)
        out = srt[at[found]]
        if len(out) > 1 and not (out[1:] > out[:-1]).all():  # rows taken out of slot order
            by_out = np.argsort(out, kind="stable")
            found, out = found[by_out], out[by_out]
        return [(int(o), cand[k][1]) for o, k in zip(out.tolist(), found.tolist())]
