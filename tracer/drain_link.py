"""The recorder's side of the drain process (``flusher="process"``, ``tracer.drain``): shared
rings for the struct families, the command/reply/notice pipes, handing swapped buffers over
at flushes and applying the drain's replies, and the flusher thread's loop in that mode.

:class:`DrainLink` is a mixin of ``tracer.recorder.Recorder`` (it uses the recorder's
buffers, locks and counters).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict

from tracer import drain as _drain
from tracer.buffers import StructBuffer, peek_count, start_turn
from tracer.schema import FAMILIES, ROW_FAMILIES, STRUCT_FAMILIES
from tracer.writer import CLOCK_ROWS

log = logging.getLogger("kvtrace.tracer")
MARKED = frozenset({"pool", "cache"})  # ts filled at flush from clock marks (clock != "event")


class _PipeWake:
    """``threading.Event``'s ``set`` for the process flusher: a byte on the notice pipe."""

    def __init__(self, rec: "DrainLink"):
        self.rec = rec

    def set(self) -> None:
        fd = self.rec._notice_w
        if fd is None:
            return
        try:
            os.write(fd, b"w")
        except (BlockingIOError, OSError, TypeError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed

    def is_set(self) -> bool:
        return False

    def clear(self) -> None:
        pass


class DrainLink:
    """The drain-process half of the recorder (see the module docstring)."""

    def _start_drain(self) -> dict:
        """Shared rings for the struct families and the drain process that empties them."""
        structs, spec, fds = {}, {}, []
        for f in STRUCT_FAMILIES:
            probe = StructBuffer(FAMILIES[f], 16, ts_in_record=not self._marked(f), shared=[None] * 3)
            nbytes = self.opts.buffer_events * probe.size
            ring = [_drain.shared_buffer(nbytes, f, commit=k < 2) for k in range(3)]  # as thread mode
            fds += [fd for fd, _m in ring]
            spec[f] = {"fds": [fd for fd, _m in ring], "nbytes": nbytes, "capacity": self.opts.buffer_events,
                       "ts_in_record": not self._marked(f)}
            structs[f] = StructBuffer(FAMILIES[f], self.opts.buffer_events, ts_in_record=not self._marked(f),
                                      shared=[m for _fd, m in ring])
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # Notices to the flusher thread (drain: "d" flush due, "h" a buffer half full; this
        # process: "w" wake-up): the thread sleeps in one blocking read, GIL released.
        self._notice_r, self._notice_w = os.pipe()
        os.set_blocking(self._notice_w, False)
        ctl_fd, self._ctl = _drain.shared_buffer(_drain.CTL_BYTES, "ctl")  # the drain's flush requests
        fds.append(ctl_fd)
        cfg = {"ctl_fd": ctl_fd, "dir": str(self.dir), "rank": self.rank, "options": asdict(self.opts), "structs": spec,
               "now0": self.now[0], "cmd_fd": cmd_r, "reply_fd": rep_w, "lock_fd": self._lock_fd,
               "notice_fd": self._notice_w, "ppid": os.getpid(), "info": self.info}
        pass_fds = fds + [cmd_r, rep_w, self._notice_w] + ([self._lock_fd] if self._lock_fd is not None else [])
        try:
            self._proc = _drain.start_drain(cfg, pass_fds)
        finally:
            for fd in fds + [cmd_r, rep_w]:
                os.close(fd)
        self._cmd_fd, self._reply_fd = cmd_w, rep_r
        ready = _drain.recv(rep_r, alive=lambda: self._proc.poll() is None)
        if not ready:
            self._close_pipes()
            raise RuntimeError(f"kvtrace: the drain process did not start (exit code {self._proc.poll()})")
        _drain.widen_pipe(cmd_w)
        self._replies = _drain.Replies(rep_r)
        self._awaited: list[int] = []  # events per message whose reply has not been applied
        return structs

    def _abort_drain(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for name in ("_cmd_fd", "_reply_fd", "_notice_r", "_notice_w"):
            fd = getattr(self, name, None)
            setattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _drain_gone(self) -> RuntimeError:
        code = self._proc.poll()
        return RuntimeError(f"the drain process exited (code {code})" if code is not None
                            else "the drain process did not answer")

    def _apply_replies(self, block: bool) -> bool:
        """Apply the drain's replies that have arrived (``block``: all awaited ones): buffers
        given back, torn records, rows written, or the error that ended recording."""
        while self._awaited:
            try:
                reply = self._replies.next(block)
            except OSError:
                reply = None
            if reply is _drain.NOT_YET:
                return True
            if reply is None:
                raise self._drain_gone()
            self._inflight -= self._awaited.pop(0)
            for name, idx in reply["released"]:
                self.structs[name].release(idx)
            for fam, reason, first, last, n in reply["torn"]:
                self.drops.add(fam, reason, first, last, n)
            self.events_written.update(reply["written"])
            if reply.get("failed"):  # later messages were refused too: nothing is in flight
                self._awaited.clear()
                self._inflight = 0
                self._fail(reply["failed"])
                return False
        return True

    def _handover(self) -> None:
        """The drain asked for a flush (``ctl[0]``): hand the buffers over now, in the emitting
        thread at a step boundary (``tick``/``set_clock``), without waiting for the writes.
        The flusher thread then never wakes while the server steps, and no GIL handoff to it can
        stall the emitter on a busy machine. Skipped while another flush runs."""
        kind = self._ctl[0]
        if not kind or self.failed or self.stopped or not self._io_lock.acquire(blocking=False):
            return
        try:
            if not self.failed:
                self._flush_process(force=kind == _drain.DUE, wait=False)
        except Exception as e:
            self._fail(e)
        finally:
            self._io_lock.release()

    def _flush_process(self, force: bool, close: bool = False, wait: bool = True) -> bool:
        """``flush`` with a drain process: swap and hand the buffers over. ``wait``: until the
        drain has written them (else its reply is applied at a later flush, see
        ``tracer.drain.Replies``)."""
        self._ctl[0] = 0  # any flush answers the drain's request
        if not self._apply_replies(block=False):
            return False
        due = {name for name, b in self.structs.items() if force or self._due(b)}
        if due & (MARKED | CLOCK_ROWS):
            due |= MARKED | CLOCK_ROWS
        s_swap = peek_count(self.seq)
        swapped = {}
        hand = self._in_hand  # buffers out of the recorder's lists and not yet in flight
        for name in self.structs:
            if name in due:
                b = self.structs[name]
                with b.lock:
                    bufs, b.pending = b.pending, []
                    hand += [(b, buf) for buf in bufs]  # counted by check_integrity meanwhile
                old = b.swap()  # (may wait for b.lock: another thread then runs)
                if old is not None:
                    bufs.append(old)
                    hand.append((b, old))
                if bufs:
                    swapped[name] = bufs
        marks = []
        if swapped:
            marks = self.marks[:]
            del self.marks[: len(marks)]
        sent = [(name, b.ring_index[id(buf[0])], b.reserved(buf), buf[2])
                for name, bufs in swapped.items() for b in (self.structs[name],) for buf in bufs]
        rows = {}
        for name in ROW_FAMILIES:
            b = self.rows[name]
            if name == "drops":
                self._drops_to_rows()
            if force or len(b.cur[0]) * 2 >= b.capacity:
                rows[name] = b.swap()
                hand.append((None, rows[name]))
        n_msg = sum(n for _f, _i, n, _s in sent) + sum(map(len, rows.values()))
        if self._cmd_fd is None:
            hand.clear()
            raise self._drain_gone()
        self._inflight += n_msg
        hand.clear()
        self._awaited.append(n_msg)
        msg = {"bufs": sent, "marks": marks, "s_swap": s_swap, "rows": rows,
               "close": close, "progress": s_swap - 1 if force else 0}
        if self.info_changed:  # e.g. coverage grown by a later install: the drain's copy is stale
            self.info_changed = False
            msg["info"] = dict(self.info)
        try:
            _drain.send(self._cmd_fd, msg)
        except OSError:
            raise self._drain_gone() from None
        return self._apply_replies(block=wait)

    def _end_drain(self) -> None:
        """Let the drain process exit (after its last reply) and reap it."""
        if self._proc is None:
            return
        if self._cmd_fd is not None:
            try:
                _drain.send(self._cmd_fd, {"exit": True})
            except OSError:
                pass
        self._close_pipes()
        try:
            self._proc.wait(self.opts.stop_timeout_s)
        except Exception:
            log.error("kvtrace: the drain process %d did not exit; killing it", self._proc.pid)
            self._proc.kill()
            self._proc.wait()

    # ---------------------------------------------------------------- emit functions
    def _loop_process(self) -> None:
        """The flusher thread with a drain process: it sleeps in a blocking read of the notice
        pipe (no GIL, no polling: the drain watches fill levels and the flush interval) and
        takes the GIL about three times per flush, since every GIL handoff to this thread may
        wait for a CPU when the machine is busy, with the emitter stalled meanwhile."""
        while not self._stop_req:
            try:
                got = os.read(self._notice_r, 4096)
            except (OSError, TypeError):
                got = b""
            start_turn()
            if self._stop_req:
                break
            if not got:
                self._fail(RuntimeError(f"the drain process exited (code {self._proc.poll()})"))
                self._flush_answered(self._flush_asked)
                return
            asked = self._flush_asked
            # a timed or half-full flush does not wait for the drain: one GIL handoff per flush
            ok = self.flush(force=b"d" in got or asked > self._flush_done, wait=asked > self._flush_done)
            self._flush_answered(asked)
            if not ok:
                return
        self._final()
        self._flush_answered(self._flush_asked)


__all__ = ["DrainLink", "MARKED"]
