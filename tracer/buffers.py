"""Per-family hot-path buffers of the recorder and its drop counters.

A struct buffer is a tuple ``(data: bytearray, ctr: itertools.count, side: list)``: ``next(ctr)``
atomically reserves the byte offset of one fixed-size record (under the GIL), so emits from
several threads never share a slot; ``side`` holds variable-length extras (pool page ids).
Buffers are swapped, never cleared: a fresh ``bytearray`` is zero-filled, so a reserved but not
yet written record shows ``seq == 0`` (seq starts at 1).
"""

from __future__ import annotations

import itertools
import struct
import threading

import numpy as np

from tracer.schema import Family

_NP_CODES = {"q": "<i8", "i": "<i4", "B": "u1", "Q": "<u8", "I": "<u4", "h": "<i2"}


class StructBuffer:
    """Double-buffered fixed-size records of one family."""

    def __init__(self, fam: Family, capacity: int):
        self.fam = fam
        self.struct = struct.Struct(fam.record_format)
        self.size = self.struct.size
        self.capacity = capacity
        names = [c.name for c in fam.columns if c.code]
        self.dtype = np.dtype({
            "names": names,
            "formats": [_NP_CODES[c.code] for c in fam.columns if c.code],
            "offsets": [struct.calcsize("<" + "".join(c.code for c in fam.columns[:i] if c.code))
                        for i, c in enumerate(fam.columns) if c.code],
            "itemsize": self.size,
        })
        self.cur = [self._new()]
        self.spare = self._new()
        self.lock = threading.Lock()
        self.pending: list[tuple] = []  # full buffers swapped out by the slow path

    def _new(self) -> tuple:
        return (bytearray(self.capacity * self.size), itertools.count(0, self.size), [])

    def reserved(self, buf: tuple) -> int:
        """Records reserved so far in ``buf`` (peeks the counter without advancing it)."""
        r = repr(buf[1])  # "count(N, size)"
        return min(int(r[6 : r.index(",")]) // self.size, self.capacity)

    def swap(self) -> tuple:
        """Swap in a fresh buffer; returns the old one. Mutates: ``cur``."""
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
