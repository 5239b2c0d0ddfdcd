"""On-disk writing shared by the recorder's flusher thread and the drain process: turning
swapped struct buffers into Arrow record batches in ``seq`` order (clock marks filling the
``ts`` of marked families, torn records counted), and the per-family stream segments they are
appended to (rotated by size and age).

:class:`SegmentWriter` is a mixin: its host holds ``dir``, ``rank``, ``opts``, ``structs``,
``segments``, ``segment_opened_s``, ``events_written``, ``drops``, ``marks`` and
``mark_carry`` (``tracer.recorder.Recorder`` and ``tracer.drain.Drain`` both do).
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from tracer import chunks as _chunks
from tracer import segments as _segments
from tracer.buffers import StructBuffer, page_ids_column, yield_gil
from tracer.schema import FAMILIES, DropReason

CLOCK_ROWS = frozenset({"sched", "stats"})  # struct rows that carry their own clock reading


class SegmentWriter:
    """Struct buffers to Arrow segments (see the module docstring)."""

    def _take_marks(self, swapped: dict, s_swap: int) -> tuple[np.ndarray, np.ndarray]:
        """Clock marks as (seq, ts) arrays sorted by seq: those carried over, tick/set_clock and
        row-family marks, and the (seq, ts) of swapped sched/stats rows. Keeps for next time the
        marks rows at or after ``s_swap`` (not flushed in this cycle) may need."""
        taken = self.marks[:]
        del self.marks[: len(taken)]  # an append racing in lands after the slice: kept
        seqs = [self.mark_carry[0], np.array([m[0] for m in taken], np.int64)]
        tss = [self.mark_carry[1], np.array([m[1] for m in taken], np.int64)]
        for name in CLOCK_ROWS & swapped.keys():
            b = self.structs[name]
            for buf in swapped[name]:
                arr = np.frombuffer(buf[0], dtype=b.dtype, count=b.reserved(buf))
                ok = arr["seq"] != 0
                seqs.append(arr["seq"][ok])
                tss.append(arr["ts_ns"][ok])
        seq, ts = np.concatenate(seqs), np.concatenate(tss)
        order = np.argsort(seq, kind="stable")
        seq, ts = seq[order], ts[order]
        keep = max(int(np.searchsorted(seq, s_swap, side="left")) - 1, 0)
        self.mark_carry = (seq[keep:].copy(), ts[keep:].copy())
        return seq, ts

    def _write_struct(self, name: str, b: StructBuffer, buf: tuple, n: int, marks) -> int:
        """Append the first ``n`` records of ``buf`` to the segment, in seq order, one IPC message
        per chunk of rows (see ``tracer.chunks``); returns torn records."""
        data, _ctr, side = buf
        arr = np.frombuffer(data, dtype=b.dtype, count=n)
        seqs = arr["seq"]
        keep = _chunks.written_mask(seqs, yield_gil)
        deadline = time.monotonic() + 0.05
        while not keep.all() and time.monotonic() < deadline:
            time.sleep(0.0002)  # a writer reserved a slot and was preempted before packing
            keep = _chunks.written_mask(seqs, yield_gil)
        torn = int(n - np.count_nonzero(keep))
        if torn:
            self._account(name, buf, 0, torn)
        ids = _chunks.SideIndex(side, yield_gil) if name == "pool" else None
        schema = b.fam.arrow_schema(stored=False)
        seg = self._segment(name)
        columns = [arr[f] for f in b.dtype.names]  # strided views
        for chunk in _chunks.row_chunks(seqs, keep, torn, yield_gil):
            arrays = []
            if not b.ts_in_record:  # ts of the latest clock mark at or before each row's seq
                idx = np.searchsorted(marks[0], seqs[chunk], side="right") - 1
                arrays.append(pa.array(marks[1][np.maximum(idx, 0)]))
            arrays.extend(pa.array(np.ascontiguousarray(c[chunk])) for c in columns)
            rows = len(arrays[-1])
            if ids is not None:
                arrays.append(page_ids_column(ids.entries(_chunks.positions(chunk)), rows))
            yield_gil()
            seg.write(pa.RecordBatch.from_arrays(arrays, schema=schema))
            self._account(name, buf, rows, 0)
            del arrays
            yield_gil()
        return torn

    def _account(self, name: str, buf: tuple, rows: int, torn: int) -> None:
        """Count ``rows`` records of ``buf`` written and ``torn`` of them dropped as torn."""
        if torn:
            self.drops.add(name, DropReason.TORN, -1, -1, torn)
        self.events_written[name] += rows

    def _segment(self, name: str) -> _segments.StreamSegment:
        seg = self.segments.get(name)
        if seg is None:
            seg = self.segments[name] = _segments.StreamSegment(self.dir, FAMILIES[name], self.rank)
            self.segment_opened_s[name] = time.monotonic()
        return seg

    def _rotate(self, force_close: bool) -> None:
        now = time.monotonic()
        for name, seg in list(self.segments.items()):
            if (force_close or seg.num_bytes >= self.opts.segment_max_bytes
                    or now - self.segment_opened_s[name] >= self.opts.segment_max_s):
                del self.segments[name]
                seg.close(between_steps=yield_gil)


__all__ = ["CLOCK_ROWS", "SegmentWriter"]
