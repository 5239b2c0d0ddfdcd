"""Per-family hot-path buffers of the recorder and its drop counters.

A struct buffer is a tuple ``(data: bytearray, ctr: itertools.count, side: list)``:
``next(ctr)`` atomically reserves the byte offset of one fixed-size record (under the GIL), so
emits from several threads never share a slot; ``side`` holds variable-length extras (pool page
ids). A clean buffer is all zeros, so a reserved but not yet written record shows ``seq == 0``
(seq starts at 1).

Buffers are recycled: after a flush the used prefix is zeroed (numpy releases the GIL for a large
fill) and the buffer returns to a small free list. Its pages stay faulted in, so the emitting
thread never pays a page fault (a fresh page costs a few microseconds in a VM, i.e. 100+ ns per
event at 40-60 bytes per record). At most ``MAX_BUFFERS`` buffers exist per family (the current
one, ``MAX_FREE`` clean spares, one pending a flush), plus one for the moment a flush swaps a fresh
buffer in for a full one that has no clean spare: an emitter that outruns the flusher drops (and
counts) events rather than growing the recorder's memory.
"""

from __future__ import annotations

import itertools
import mmap
import struct
import sys
import threading
import time

import numpy as np
import pyarrow as pa

from tracer.schema import Family
from tracer.schema.storage import ARROW_POOL

MAX_FREE = 2
MAX_BUFFERS = 2 + MAX_FREE  # per family: current, clean spares, one pending a flush
_ZERO_CHUNK = 1 << 20  # bytes zeroed per GIL hold when recycling


# The flusher hands the GIL over with a real nap, and never with ``time.sleep(0)``: a thread
# waiting for the GIL sleeps on a condition variable with the 5 ms switch interval as timeout;
# ``sleep(0)`` drops the GIL for about a microsecond, the flusher, still on its CPU, usually takes
# it back before the waiter runs, and the waiter, having lost that race, waits a whole interval
# again. Measured with the stall benchmark: with ``sleep(0)`` between steps 4 of 5 runs had a
# trial above 5 ms; without, 7 of 26 (one or more of 5 trials). A nap longer than the waiter's
# wake-up lets it in.
HANDOFF_NAP_S = 50e-6
HANDOFF_MAX_S = 2e-3  # the longest a handoff insists on an active emitter getting the GIL
HOLD_BUDGET_NS = 500_000  # the flusher holds the GIL at most this long before a nap
_turn = [0]  # perf_counter_ns of the flusher's last handoff (or wake-up)
# () -> int that grows whenever an emitter runs (the recorder's seq counter), and whether the
# emitters were active at the last handoff.
_progress: list = [None, False]


def set_progress_probe(probe, only_if=None) -> None:
    """``probe``: ``() -> int`` that changes whenever an emitting thread has run (the recorder's
    ``seq``); None to forget it. ``only_if``: replace only that probe (no-op otherwise)."""
    if only_if is None or _progress[0] is only_if:
        _progress[0], _progress[1] = probe, False


def yield_gil() -> None:
    """Between two steps of the flusher: a real handoff (``handoff``) once the flusher has run
    ``HOLD_BUDGET_NS`` since the last one, else nothing (a quick release would only make a
    waiting thread lose a race; see above)."""
    if time.perf_counter_ns() - _turn[0] >= HOLD_BUDGET_NS:
        handoff()


def handoff() -> None:
    """Nap so that a thread waiting for the GIL gets it (after the flusher released a lock an
    emitter may be blocked on, and every ``HOLD_BUDGET_NS`` of flusher work).

    A nap does not guarantee the handoff: a waiter whose CPU is slow to wake (a halted vCPU)
    finds the GIL taken again and waits a whole switch interval more. So when the emitters ran
    during the last handoff (they are busy), the flusher naps again until the progress probe
    shows they ran, for at most ``HANDOFF_MAX_S``. An idle server costs one nap."""
    probe = _progress[0]
    if probe is None:
        time.sleep(HANDOFF_NAP_S)
    else:
        before = probe()
        time.sleep(HANDOFF_NAP_S)
        if _progress[1]:
            deadline = time.perf_counter_ns() + int(HANDOFF_MAX_S * 1e9)
            while probe() == before and time.perf_counter_ns() < deadline:
                time.sleep(HANDOFF_NAP_S)
        _progress[1] = probe() != before
    _turn[0] = time.perf_counter_ns()


def start_turn() -> None:
    """The flusher woke up: its GIL-holding budget starts now."""
    _turn[0] = time.perf_counter_ns()


_NP_CODES = {"q": "<i8", "i": "<i4", "B": "u1", "Q": "<u8", "I": "<u4", "h": "<i2"}


class StructBuffer:
    """Double-buffered fixed-size records of one family."""

    def __init__(self, fam: Family, capacity: int, ts_in_record: bool = True, shared: list | None = None):
        """``ts_in_record=False``: records omit ``ts_ns`` (the recorder fills it at flush from
        its clock marks, saving a load and a packed field per emit). ``shared``: a fixed ring of
        ``1 + MAX_FREE`` shared-memory buffers (``flusher="process"``, see ``tracer.drain``):
        the first is current, the others free; ``swap`` then never allocates."""
        self.fam = fam
        self.ts_in_record = ts_in_record
        cols = [c for c in fam.columns if c.code and (ts_in_record or c.name != "ts_ns")]
        self.struct = struct.Struct("<" + "".join(c.code for c in cols))
        self.size = self.struct.size
        self.capacity = capacity
        self.dtype = np.dtype({
            "names": [c.name for c in cols],
            "formats": [_NP_CODES[c.code] for c in cols],
            "offsets": [struct.calcsize("<" + "".join(c.code for c in cols[:i])) for i in range(len(cols))],
            "itemsize": self.size,
        })
        self.lock = threading.Lock()
        self.pending: list[tuple] = []  # full buffers swapped out by the slow path
        self.shared = shared
        if shared is not None:
            self.ring_index = {id(m): i for i, m in enumerate(shared)}
            self.free = [(m, itertools.count(0, self.size), []) for m in shared[1:]]
            self.cur = [(shared[0], itertools.count(0, self.size), [])]
            return
        self.live = 0  # buffers this family holds: current, pending, free and being flushed
        self.free: list[tuple] = [self._new(committed=True)]  # clean buffers (the slow path's spare)
        self.cur = [self._new(committed=True)]

    def _new(self, committed: bool = False) -> tuple:
        """A clean buffer. ``committed``: a ``bytearray`` (memset now, so its pages are faulted
        in) -- for ``start()``, in the caller's thread. Otherwise an anonymous ``mmap``: zero pages
        without a memset holding the GIL in the flusher; the emitter faults them in on first use,
        once, since buffers are recycled. Not ``np.zeros``: numpy asks for transparent huge pages
        for arrays of 4 MiB or more, and the emitter would then stall ~4.5 ms per 2 MiB fault
        (see ``tracer.chunks``)."""
        n = self.capacity * self.size
        self.live += 1
        return (bytearray(n) if committed else _zero_pages(n), itertools.count(0, self.size), [])

    def _new_small(self) -> tuple:
        return (bytearray(self.size), itertools.count(0, self.size), [])

    def recycle(self, buf: tuple, used_records: int) -> None:
        """Zero the used prefix of a flushed buffer and keep it for reuse, unless the spares are
        full or the family holds more than ``MAX_BUFFERS``. Mutates: ``free``, ``live``."""
        if len(self.free) >= MAX_FREE or self.live > MAX_BUFFERS:
            self.discard()
            return
        view = np.frombuffer(buf[0], np.uint8, count=used_records * self.size)
        for start in range(0, len(view), _ZERO_CHUNK):  # short GIL holds: see yield_gil
            view[start : start + _ZERO_CHUNK] = 0
            yield_gil()
        with self.lock:
            self.free.append((buf[0], itertools.count(0, self.size), []))

    def discard(self) -> None:
        """A flushed buffer is let go (not reused). Mutates: ``live``."""
        if self.shared is None:
            self.live -= 1

    def top_up(self) -> None:
        """After a flush: a clean spare for the emitter's next full buffer, while the family holds
        fewer than ``MAX_BUFFERS``. Mutates: ``free``, ``live``."""
        if not self.free and self.live < MAX_BUFFERS:
            self.free.append(self._new())

    def take_free(self) -> tuple:
        with self.lock:
            return self.free.pop() if self.free else None

    def reserved(self, buf: tuple) -> int:
        """Records reserved so far in ``buf`` (peeks the counter without advancing it)."""
        return min(peek_count(buf[1]) // self.size, self.capacity)

    def check_integrity(self) -> None:
        """At most MAX_FREE spares and MAX_BUFFERS + 1 buffers in all; spares are clean."""
        assert len(self.free) <= MAX_FREE, f"{self.fam.name}: {len(self.free)} free buffers"
        if self.shared is None:
            assert 1 <= self.live <= MAX_BUFFERS + 1, f"{self.fam.name}: {self.live} buffers live"
        for data, ctr, side in self.free:
            assert peek_count(ctr) == 0 and not side, f"{self.fam.name}: a free buffer is in use"
            assert len(data) == self.capacity * self.size, f"{self.fam.name}: buffer size"

    def release(self, idx: int) -> None:
        """The drain process gave ring buffer ``idx`` back, zeroed. Mutates: ``free``."""
        with self.lock:
            self.free.append((self.shared[idx], itertools.count(0, self.size), []))

    def swap(self) -> tuple | None:
        """Swap in a clean buffer; returns the old one (None: a shared ring has no free buffer
        now, the current one stays). Mutates: ``cur``, ``free``."""
        new = self.take_free()
        if new is None:
            if self.shared is not None:
                return None
            new = self._new()
        with self.lock:
            old, self.cur[0] = self.cur[0], new
        return old


class RowBuffer:
    def __init__(self, fam: Family, capacity: int):
        self.fam = fam
        self.capacity = capacity
        self.cur: list[list] = [[]]
        self.lock = threading.Lock()

    def swap(self) -> list:
        with self.lock:
            old, self.cur[0] = self.cur[0], []
        return old


class Drops:
    """Drop counters per (family, reason), emitted as ``drops`` rows at each flush."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open: dict[tuple[str, int], list] = {}
        self.total = 0

    def add(self, family: str, reason: int, first: int, last: int, n: int, detail: str = "") -> None:
        with self.lock:
            e = self.open.get((family, reason))
            if e is None:
                self.open[(family, reason)] = [first, last, n, detail]
            else:
                e[0] = min(e[0], first) if first >= 0 and e[0] >= 0 else max(e[0], first)
                e[1] = max(e[1], last)
                e[2] += n
            self.total += n

    def take(self) -> dict:
        with self.lock:
            out, self.open = self.open, {}
        return out


def _zero_pages(n: int):
    """``n`` zero bytes in small pages, faulted in lazily (a ``bytearray`` where anonymous
    private mappings do not exist, e.g. Windows)."""
    if not hasattr(mmap, "MAP_PRIVATE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return bytearray(n)
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # not shared with a fork
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):  # THP "always" systems
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return m


def _peek_by_repr(counter: itertools.count) -> int:
    r = repr(counter)  # "count(N)" or "count(N, step)"
    end = r.find(",")
    return int(r[6 : end if end > 0 else -1])


def _peek_by_reduce(counter: itertools.count) -> int:
    return counter.__reduce__()[1][0]  # (count, (N,) or (N, step)): ~10x cheaper than the repr


#: the next value ``next(counter)`` returns, without taking it (a replay marks each step's clock
#: with it). ``itertools`` pickling is deprecated from Python 3.12 (gone in 3.14): the repr there.
peek_count = _peek_by_reduce if sys.version_info < (3, 12) else _peek_by_repr


def page_ids_column(side: list, n: int) -> pa.Array:
    """A ``list<int32>`` column of ``n`` rows from ``side``: ``(row, ids)`` sorted by row; null
    where no row carries ids."""
    typ = pa.list_(pa.int32())
    if not side:
        return pa.nulls(n, typ, memory_pool=ARROW_POOL)
    lens = np.zeros(n, np.int32)
    valid = np.zeros(n, bool)
    values = []
    for k, (i, ids) in enumerate(side):
        if k & 2047 == 2047:
            yield_gil()  # a Python loop: the GIL's eval-breaker would hand over only after 5 ms
        v = np.asarray(ids, dtype=np.int32).ravel()
        lens[i] = len(v)
        valid[i] = True
        values.append(v)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(values)), type=typ,
                                    mask=pa.array(~valid), pool=ARROW_POOL)
