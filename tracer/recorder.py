"""The in-server recorder: preallocated columnar buffers, generated emit functions, a flusher.

Hot path (struct families ``pool``, ``cache``, ``sched``, ``stats``)::

    s = next(seq)                          # atomic under the GIL: the total order
    data, ctr, side = cur[0]               # current buffer (swapped by the flusher)
    pack_into(data, next(ctr), ts, s, ...) # next(ctr) reserves a record slot atomically

``struct.error`` (buffer full) falls to a slow path that swaps in the spare buffer or counts a
drop. The flusher thread swaps buffers every ``flush_interval_ms`` (or at half fill), turns the
old one into Arrow columns with numpy (no per-event Python work, so it does not hold the GIL
long), and appends one IPC record batch per family to the open segment with ``os.write``.

Row families (``request``, ``drops``) are rare events with variable-length columns: tuples
appended to a bounded list under a lock.

Timestamps: in ``clock="step"`` mode (default) ``pool`` and ``cache`` rows take the step clock
(``tick()``, refreshed also by every ``sched``/``stats``/``request`` emit); ordering comes from
``seq``. ``clock="event"`` reads the monotonic clock in every emit. ``clock="manual"`` never reads
it: the driver sets the time with ``tracer.set_clock(ts_ns)`` (simulators and the real-code
backend record on their virtual clock, so their traces are deterministic).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import struct
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracer.schema import manifest as _manifest
from tracer import drain as _drain
from tracer import segments as _segments
from tracer.buffers import (Drops, RowBuffer, StructBuffer, handoff, page_ids_column, peek_count,
                            set_progress_probe, start_turn, yield_gil)
from tracer.drain_link import MARKED as _MARKED
from tracer.drain_link import DrainLink, _PipeWake
from tracer.options import RecorderOptions
from tracer.writer import CLOCK_ROWS as _CLOCK_ROWS
from tracer.writer import SegmentWriter
from tracer.emitgen import _READS_CLOCK, _gen_emit
from tracer.lifecycle import Lifecycle
from tracer.schema import FAMILIES, ROW_FAMILIES, STRUCT_FAMILIES, DropReason

log = logging.getLogger("kvtrace.tracer")


# Callables returning extra rank-file keys, asked when each recording starts (the sglang hooks
# add their ``coverage``; a provider may later update ``Recorder.info`` itself).
RANK_INFO_PROVIDERS: list = []


# --------------------------------------------------------------------------------------------
# Recorder
# --------------------------------------------------------------------------------------------
class Recorder(SegmentWriter, DrainLink, Lifecycle):
    """One process's recording into one rank partition of a trace directory.

    Args:
        out_dir: trace directory (created; joined if it already holds a manifest).
        rank: partition to write; None claims the lowest free rank.
        options: RecorderOptions.
        manifest_fields: extra manifest keys (server, hash_block_tokens, env, ...), used only
            when this process creates the trace.
        source: manifest ``producer.source``.
        on_disable: called when recording stops (no args: unbind the emits) or fails (with the
            counting emits to bind instead, see ``_counting_emits``).
    """

    def __init__(self, out_dir, rank=None, options=None, manifest_fields=None, source="tracer",
                 on_disable=None):
        self.dir = Path(out_dir)
        self.opts = options or RecorderOptions()
        self.pid = os.getpid()
        fields = dict(manifest_fields or {})
        fields.setdefault("options", asdict(self.opts))
        self.manifest = _manifest.create_or_join(self.dir, _manifest.new_manifest(source=source, **fields))
        self.anchor_ns = int(self.manifest["clock"]["monotonic_ns"])
        self.info = {"pid": self.pid, "ppid": os.getppid(), "host": socket.gethostname(),
                     "started_unix_ns": time.time_ns(), "options": asdict(self.opts), "state": "recording"}
        for provider in list(RANK_INFO_PROVIDERS):  # e.g. the sglang hooks' coverage
            try:
                self.info.update(provider() or {})
            except Exception as e:
                log.error("kvtrace: rank info provider %r failed: %s", provider, e)
        self.rank = _manifest.claim_rank(self.dir, rank, self.info)
        # Held while recording: ``kvtrace recover`` refuses a rank whose lock is taken.
        self._lock_fd = _manifest.hold_rank_lock(self.dir, self.rank)
        self.end_state = "complete"  # written to the rank file when the flusher finishes
        self.info_changed = False  # set by whoever updates ``info`` later (the hooks' coverage)
        self._progress_seq = 0
        self.seq = itertools.count(1)
        self.now = [0 if self.opts.clock == "manual" else time.monotonic_ns() - self.anchor_ns]
        # pool/cache rows leave ts out of the record unless clock="event": the flusher fills it
        # from clock marks (seq, ts) left by tick/set_clock and by every emit that reads the clock.
        self.marks: list[tuple[int, int]] = []
        self.mark_carry = (np.zeros(1, np.int64), np.full(1, self.now[0], np.int64))
        self._proc = None
        self._inflight = 0  # events handed to the drain process and not accounted for yet
        self._in_hand: list[tuple] = []  # (buffer, records) being swapped out for the drain
        # The flusher thread's own accounting, under ``_acct`` (``check_integrity`` may run in
        # another thread meanwhile): struct buffers swapped out and being written, by id of
        # their memory, as [StructBuffer, buffer, records accounted so far]; row records swapped
        # out and not yet written.
        self._acct = threading.Lock()
        self._flushing: dict[int, list] = {}
        self._rows_flushing = 0
        if self.opts.flusher == "process":
            try:
                self.structs = self._start_drain()
            except (OSError, RuntimeError) as e:  # no memfd, a file-size limit, no interpreter...
                log.error("kvtrace: could not start the drain process (%s); using the flusher thread", e)
                self._abort_drain()
        if self._proc is None:
            self.structs = {f: StructBuffer(FAMILIES[f], self.opts.buffer_events, ts_in_record=not self._marked(f))
                            for f in STRUCT_FAMILIES}
        self.rows = {f: RowBuffer(FAMILIES[f], self.opts.row_buffer_events) for f in ROW_FAMILIES}
        self.drops = Drops()
        self.segments: dict[str, _segments.StreamSegment] = {}
        self.segment_opened_s: dict[str, float] = {}
        self.events_written = {f: 0 for f in FAMILIES}
        self.failed: str | None = None
        self.stopped = False
        self._on_disable = on_disable or (lambda emits=None: None)
        self._io_lock = threading.Lock()  # one flush at a time (flusher thread or stop())
        self._wake = threading.Event() if self._proc is None else _PipeWake(self)
        self._stop_req = False
        # Flushes asked for by other threads (``request_flush``) run in the flusher thread, so a
        # signal raised in the caller (KeyboardInterrupt) never cuts a flush half way.
        self._flush_cv = threading.Condition()
        self._flush_asked = 0
        self._flush_done = 0
        self.emits = self._build_emits()
        if self._proc is None:
            self._warm_up()
        self._thread = threading.Thread(target=self._run, name="kvtrace-flusher", daemon=True)
        self._thread.start()

    def _marked(self, family: str) -> bool:
        """Rows of ``family`` take ts from clock marks at flush (no ts in the hot-path record)."""
        return self.opts.clock != "event" and family in _MARKED

    def _build_emits(self) -> dict:
        emits = {}
        mono, anchor = time.monotonic_ns, self.anchor_ns
        for name in STRUCT_FAMILIES + ROW_FAMILIES:
            reads_clock = self.opts.clock == "event" or (self.opts.clock == "step" and name in _READS_CLOCK)
            # Clock-reading struct rows (sched, stats) are marks already: the flusher reads their
            # (seq, ts) columns. Only the rare row-family emits append a mark.
            gen = {"ts_in_record": not self._marked(name),
                   "marks": reads_clock and self.opts.clock == "step" and name in ROW_FAMILIES}
            variants = [(name, False)] + ([("pool_ids", True)] if name == "pool" else [])
            for fn_name, with_ids in variants:
                ns = {"next": next, "seq": self.seq, "now": self.now, "mono": mono, "anchor": anchor,
                      "mark": self.marks.append}
                if name in self.structs:
                    b = self.structs[name]
                    ns.update(cur=b.cur, pack=b.struct.pack_into, error=struct.error, size=b.size,
                              full=self._struct_full_handler(b))
                else:
                    b = self.rows[name]
                    ns.update(cur=b.cur, lock=b.lock, cap=b.capacity, full=self._row_full_handler(b))
                src = _gen_emit(name, reads_clock, with_ids, **gen)
                if name == "sched" and self._proc is not None:  # a step boundary, see _handover
                    src += _drain.STEP_CHECK
                    ns.update(ctl=self._ctl, handover=self._handover)
                exec(compile(src, f"<kvtrace emit {fn_name}>", "exec"), ns)
                emits[fn_name] = ns[fn_name]
        if self.opts.detail != "pages":
            pool = emits["pool"]
            emits["pool_ids"] = lambda p, o, r, n, np_=0, d=0, page_ids=None: pool(p, o, r, n, np_, d)

        now, seq, mark = self.now, self.seq, self.marks.append

        if self.opts.clock == "manual":
            def tick() -> int:
                return now[0]

            def set_clock(ts_ns: int) -> int:
                # every row reads ``now[0]`` here: a mark only where it changes (a replay sets the
                # clock at each step's end and again at the next step's begin, to the same value)
                t = int(ts_ns)
                if t != now[0]:
                    now[0] = t
                    mark((peek_count(seq), t))
                return t
        else:
            def tick() -> int:
                t = now[0] = mono() - anchor
                mark((peek_count(seq), t))
                return t

            def set_clock(ts_ns: int) -> int:
                raise RuntimeError("tracer.set_clock needs clock='manual'")

        if self._proc is not None:  # hand buffers over at step boundaries, see _handover
            tick = _drain.at_step_boundary(tick, self._ctl, self._handover)
            set_clock = _drain.at_step_boundary(set_clock, self._ctl, self._handover)
        emits["tick"] = tick
        emits["set_clock"] = set_clock
        emits["peek_seq"] = lambda: peek_count(seq)
        return emits

    def _struct_full_handler(self, b: StructBuffer):
        drops, wake = self.drops, self._wake

        def full(s, rec, ids=None):
            with b.lock:
                for attempt in (0, 1):
                    data, ctr, side = b.cur[0]
                    off = next(ctr)
                    try:
                        b.struct.pack_into(data, off, *rec)
                        if ids is not None:
                            side.append((off // b.size, ids))
                        return
                    except struct.error:
                        if attempt or not b.free:
                            break
                        b.pending.append(b.cur[0])
                        b.cur[0] = b.free.pop()
                        wake.set()
            drops.add(b.fam.name, DropReason.BUFFER_FULL, s, s, 1)
            if not wake.is_set():
                wake.set()

        return full

    def _row_full_handler(self, b: RowBuffer):
        drops, wake = self.drops, self._wake

        def full(s, _rec):
            drops.add(b.fam.name, DropReason.BUFFER_FULL, s, s, 1)
            if not wake.is_set():
                wake.set()

        return full

    def _warm_up(self) -> None:
        """Run the flush conversion once on a dummy record, in the caller's thread: the lazy
        imports inside numpy/pyarrow then never run (GIL held) in the flusher."""
        for name, b in self.structs.items():
            buf = b._new_small()
            b.struct.pack_into(buf[0], 0, *([1] * len(b.dtype.names)))
            arr = np.frombuffer(buf[0], dtype=b.dtype, count=1)
            seqs = arr["seq"]
            bool(seqs.all()), int((seqs != 0).sum()), np.argsort(seqs, kind="stable")
            arrays = [pa.array(np.ascontiguousarray(arr[f])) for f in b.dtype.names]
            if not b.ts_in_record:
                arrays.insert(0, pa.array(np.zeros(1, np.int64)))
            if name == "pool":
                arrays.append(page_ids_column([(0, [1])], 1))
            pa.RecordBatch.from_arrays(arrays, schema=b.fam.arrow_schema(stored=False)).serialize()

    # ---------------------------------------------------------------- flushing
    def _run(self) -> None:
        interval_s = self.opts.flush_interval_ms / 1000
        poll_s = min(self.opts.poll_interval_ms / 1000, interval_s)
        last = time.monotonic()
        seq = self.seq

        def probe() -> int:
            return peek_count(seq)

        if self._proc is not None:  # no GIL handoffs to insist on: nothing here holds it long
            self._loop_process()
            return
        set_progress_probe(probe)  # handoffs insist while emitters are busy
        try:
            self._loop(interval_s, poll_s, last)
        finally:
            set_progress_probe(None, only_if=probe)  # a later recorder may have set its own

    def _loop(self, interval_s: float, poll_s: float, last: float) -> None:
        while not self._stop_req:
            self._wake.wait(poll_s)
            start_turn()
            self._wake.clear()
            if self._stop_req:
                break
            now = time.monotonic()
            asked = self._flush_asked
            due = now - last >= interval_s or asked > self._flush_done
            if due:
                last = now
            ok = self.flush(force=due)
            self._flush_answered(asked)
            if not ok:
                return
        self._final()
        self._flush_answered(self._flush_asked)

    def _flush_answered(self, asked: int) -> None:
        if asked > self._flush_done:
            with self._flush_cv:
                self._flush_done = max(self._flush_done, asked)
                self._flush_cv.notify_all()

    def request_flush(self, timeout_s: float | None = None) -> bool:
        """Have the flusher thread write everything buffered now and wait for it (``tracer.flush``).

        A signal in the calling thread interrupts only the wait: the flush itself completes in
        the flusher thread, so no swapped buffer is ever lost half written. Falls back to a
        flush in this thread when the flusher is not running. Returns False when recording failed.
        """
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return self.flush(force=True)
        with self._flush_cv:
            self._flush_asked += 1
            want = self._flush_asked
        self._wake.set()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._flush_cv:
            while self._flush_done < want and self._thread.is_alive():
                left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                if left <= 0:
                    break
                self._flush_cv.wait(left)
        return not self.failed

    def _due(self, b: StructBuffer) -> bool:
        return bool(b.pending) or b.reserved(b.cur[0]) * 2 >= b.capacity

    def flush(self, force: bool = True, wait: bool = True) -> bool:
        """Write buffered events (all families when ``force``, else only those half full).
        ``wait=False`` (drain process only): hand them over without waiting for the writes.

        Returns False when recording has failed. Never raises.
        """
        if self.failed:
            return False
        if self._proc is not None:
            with self._io_lock:
                if self.failed:
                    return False
                try:
                    return self._flush_process(force, wait=wait)
                except Exception as e:
                    self._fail(e)
                    return False
        with self._io_lock:
            try:
                due = {name for name, b in self.structs.items() if force or self._due(b)}
                if due & (_MARKED | _CLOCK_ROWS):  # marked rows and their marks flush together
                    due |= _MARKED | _CLOCK_ROWS
                s_swap = peek_count(self.seq)  # rows from here on go to the next cycle
                with self._acct:  # out of the buffers and into ``_flushing`` at once
                    swapped = {name: self._swap_struct(self.structs[name]) for name in self.structs if name in due}
                    for name, bufs in swapped.items():
                        for buf in bufs:
                            self._flushing[id(buf[0])] = [self.structs[name], buf, 0]
                if swapped:  # an emitter that found its buffer full may wait on a swap lock
                    handoff()
                # After the swaps every swapped row's mark is in; nothing swapped: marks wait.
                marks = self._take_marks(swapped, s_swap) if swapped else None
                for name, bufs in swapped.items():
                    self._flush_struct(name, self.structs[name], bufs, marks)
                    yield_gil()
                for name in ROW_FAMILIES:
                    b = self.rows[name]
                    if name == "drops":
                        self._drops_to_rows()
                    if force or len(b.cur[0]) * 2 >= b.capacity:
                        self._flush_rows(name, b)
                self._rotate(force_close=False)
                if force:
                    self._write_progress(s_swap - 1)
                if self.info_changed:  # e.g. the hooks' coverage grew after a later install
                    self.info_changed = False
                    self._write_progress(self._progress_seq, rewrite=True)
                return True
            except Exception as e:  # disk full, directory removed, ...
                self._fail(e)
                return False

    @staticmethod
    def _swap_struct(b: StructBuffer) -> list:
        with b.lock:
            bufs, b.pending = b.pending, []
        bufs.append(b.swap())
        return bufs

    def _flush_struct(self, name: str, b: StructBuffer, bufs: list, marks) -> None:
        for buf in bufs:
            n = b.reserved(buf)
            torn = self._write_struct(name, b, buf, n, marks) if n else 0
            with self._acct:
                self._flushing.pop(id(buf[0]), None)
            if not torn:  # a torn slot may still be written late: never reuse that buffer
                b.recycle(buf, n)
            else:
                b.discard()
        b.top_up()

    def _account(self, name: str, buf: tuple, rows: int, torn: int) -> None:
        with self._acct:
            super()._account(name, buf, rows, torn)
            entry = self._flushing.get(id(buf[0]))
            if entry is not None:
                entry[2] += rows + torn

    def _flush_rows(self, name: str, b: RowBuffer) -> None:
        with self._acct:
            rows = b.swap()
            self._rows_flushing += len(rows)
        if not rows:
            return
        schema = b.fam.arrow_schema(stored=False)
        cols = list(zip(*rows))
        arrays = [pa.array(c, type=f.type) for c, f in zip(cols, schema)]
        self._segment(name).write(pa.RecordBatch.from_arrays(arrays, schema=schema), between_steps=yield_gil)
        with self._acct:
            self.events_written[name] += len(rows)
            self._rows_flushing -= len(rows)

    def _drops_to_rows(self) -> None:
        t = time.monotonic_ns() - self.anchor_ns
        with self._acct:  # a drops row's seq is issued and its row buffered at once
            rows = self.rows["drops"].cur[0]
            for (fam, reason), (first, last, n, detail) in self.drops.take().items():
                rows.append((t, next(self.seq), fam, first, last, n, int(reason), detail))

    def check_integrity(self) -> None:
        """Accounting holds: every issued seq is written, dropped or still buffered (exactly, when
        no other thread is emitting), and each family's memory stays within its bound.
        Raises AssertionError naming what broke."""
        with self._acct:  # the flusher thread's swaps and counts wait meanwhile
            for b in self.structs.values():
                b.check_integrity()
            buffered = sum(b.reserved(b.cur[0]) + sum(b.reserved(p) for p in b.pending)
                           for b in self.structs.values())
            buffered += sum(len(b.cur[0]) for b in self.rows.values()) + self._inflight
            buffered += sum(len(buf) if b is None else b.reserved(buf) for b, buf in list(self._in_hand))
            buffered += sum(b.reserved(buf) - done for b, buf, done in self._flushing.values()) + self._rows_flushing
            issued = peek_count(self.seq) - 1
            accounted = sum(self.events_written.values()) + self.drops.total + buffered
        assert accounted == issued, f"recorder accounts for {accounted} events but issued {issued} seqs"
        if self.failed:
            assert not self.segments, "a failed recorder keeps no open segment"
