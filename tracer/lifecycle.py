"""How a recording ends (a mixin of :class:`tracer.recorder.Recorder`): a write failure (the
rank file says crashed, the emits only count what is lost from then on), the final flush of
the flusher thread, ``stop`` and a forked child's abandon. Never raises into the server."""

from __future__ import annotations

import logging
import os
import threading
import time

import pyarrow as pa

from tracer import segments as _segments
from tracer.buffers import peek_count
from tracer.schema import DropReason
from tracer.schema import manifest as _manifest

log = logging.getLogger("kvtrace.tracer")


class Lifecycle:
    """The ends of a :class:`tracer.recorder.Recorder` (see the module docstring)."""

    def _fail(self, exc: BaseException) -> None:
        if self.failed:
            return
        self.failed = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        with self._acct:  # what was being written is in ``lost`` below
            self._flushing.clear()
            self._rows_flushing = 0
        self._on_disable(self._counting_emits())
        issued = peek_count(self.seq) - 1
        lost = max(issued - sum(self.events_written.values()) - self.drops.total, 0)
        log.error("kvtrace: recording to %s disabled after a write error (%s); %d events lost",
                  self.dir, self.failed, lost)
        for seg in self.segments.values():
            seg.abandon()
        self.segments.clear()
        s_fail = next(self.seq)  # the row below is an event of this rank too
        try:  # best effort: the target may be gone or full
            t = time.monotonic_ns() - self.anchor_ns
            table = pa.table({"ts_ns": [t], "seq": [s_fail], "family": [""], "first_seq": [-1],
                              "last_seq": [issued], "num_events": [lost],
                              "reason": [int(DropReason.WRITE_ERROR)], "detail": [self.failed]})
            _segments.write_family_table(self.dir, "drops", table, rank=self.rank)
            self.events_written["drops"] += 1
        except Exception:
            self.drops.add("drops", DropReason.WRITE_ERROR, s_fail, s_fail, 1)
        self._write_info("crashed", lost=lost)
        self._end_drain()
        self._release_lock()

    def _counting_emits(self) -> dict:
        """Emits bound after a write failure: each only takes a seq, so the events the server
        keeps emitting are counted as lost (the rank file's ``issued``) rather than vanishing."""
        seq = self.seq

        def lost(*_a, **_k) -> None:
            next(seq)

        emits = {name: lost for name in self.emits if name not in ("tick", "set_clock", "peek_seq")}
        emits.update({k: self.emits[k] for k in ("tick", "set_clock", "peek_seq")})
        return emits

    def _final(self) -> None:
        if self.failed:
            self._end_drain()
            return
        if self._proc is not None:
            ok = self.flush(force=True)
            if ok:
                with self._io_lock:
                    try:
                        ok = self._flush_process(force=True, close=True)
                    except Exception as e:
                        self._fail(e)
                        ok = False
            self._end_drain()
            if ok:
                self._write_info(self.end_state)
            self._release_lock()
            return
        if self.flush(force=True):
            with self._io_lock:
                try:
                    self._rotate(force_close=True)
                except Exception as e:
                    self._fail(e)
                    return
            self._write_info(self.end_state)
        self._release_lock()

    def _write_info(self, state: str, lost: int = 0) -> None:
        """Write the rank file's end state (one of ``tracer.schema.manifest.END_STATES``)."""
        if state == "complete":  # a clean end of a partial or uncovered capture says so
            state = _manifest.coverage_end_state(self.info.get("coverage"))
        info = dict(self.info, state=state, stopped_unix_ns=time.time_ns(),
                    events=dict(self.events_written), dropped=self.drops.total, lost=lost,
                    issued=peek_count(self.seq) - 1, error=self.failed)
        try:
            _manifest.update_rank_info(self.dir, self.rank, info)
        except Exception as e:  # the segments stay readable; recover can still mark the rank
            log.error("kvtrace: could not write the end state of rank %d to %s: %s", self.rank, self.dir, e)

    def _write_progress(self, flushed_seq: int, rewrite: bool = False) -> None:
        """Note in the rank file that every seq up to ``flushed_seq`` is on disk or counted in
        ``drops``: recovery then counts a torn or lost tail beyond the last seq on disk."""
        if flushed_seq <= self._progress_seq and not rewrite:
            return
        self._progress_seq = flushed_seq
        try:
            _manifest.update_rank_info(self.dir, self.rank, dict(self.info, flushed_seq=flushed_seq))
        except Exception:  # progress is advisory; the segments are what counts
            pass

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def stop(self, end_state: str = "complete") -> None:
        """Flush everything, close and convert the open segments, and write ``end_state``
        ("complete", "interrupted" or "crashed") to the rank file. Idempotent; never raises."""
        if self.stopped:
            return
        if end_state not in _manifest.END_STATES:
            end_state = "crashed"
        self.end_state = end_state
        self.stopped = True
        self._on_disable()
        self._stop_req = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.opts.stop_timeout_s)
            if self._thread.is_alive():
                log.error("kvtrace: flusher did not finish within %.1fs", self.opts.stop_timeout_s)
        if self.failed and self.failed != "forked":  # the final count, emits since the failure too
            issued = peek_count(self.seq) - 1
            self._write_info("crashed", lost=max(issued - sum(self.events_written.values())
                                                 - self.drops.total, 0))

    def abandon_in_child(self) -> None:
        """In a forked child: forget the parent's buffers and files without writing anything."""
        self.stopped = True
        self.failed = "forked"
        self._close_pipes()  # the drain must see end of file when the parent dies
        self._proc = None
        fd, self._lock_fd = self._lock_fd, None  # the parent's lock stays held by the parent
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        for seg in self.segments.values():
            seg.abandon()
        self.segments.clear()
