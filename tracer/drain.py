"""Out-of-process flushing (``RecorderOptions.flusher = "process"``): the drain process.

Why: with other processes competing for the cores, the in-process flusher thread gets
preempted while it holds the GIL, and an emitting thread then stalls for the whole time slice
(8-21 ms measured on 2 vCPUs). Here the server's interpreter only fills fixed-size records and
hands full buffers over; Arrow serialization, IPC writes and Parquet conversion run in a
separate process, as kernel tracers drain per-CPU rings.

Layout:

- every struct family has a ring of ``1 + MAX_FREE`` buffers, each a ``memfd`` mapped
  ``MAP_SHARED`` in the server and in the drain process (passed with ``pass_fds`` to a child
  started with ``subprocess`` -- never a fork of the server);
- the recorder's flusher thread swaps buffers as before and sends one message per flush over a
  pipe: the swapped buffers (ring index, records reserved, pool page ids), the clock marks and
  the row-family rows (pickled). It then waits for the reply in ``os.read`` (GIL released): the
  buffers the drain zeroed and gives back, the rows written per family, torn records, or the
  error that ended recording (disk full);
- a full ring drops events, counted as today (``drops`` rows, reason ``buffer_full``);
- the drain holds an inherited descriptor of the rank's liveness lock, so ``kvtrace recover``
  waits for it too. When the server dies (end of file on the pipe, or a new parent pid) the
  drain closes and converts the segments it wrote and exits: a SIGKILL of the server loses the
  events of at most one flush interval (those not handed over yet).
"""

from __future__ import annotations

import mmap
import os
import pickle
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

from tracer.fdwait import wait_readable
from tracer.writer import SegmentWriter

_LEN = struct.Struct("<Q")
CTL_BYTES = 4096  # the control page: byte 0 is the drain's request to the emitting thread
DUE, HALF = ord("d"), ord("h")  # ... a flush of everything (interval due), of half-full buffers
# The flusher thread is woken only when a request went unanswered this long (and a flush
# interval): the server is idle or does not tick. Not shorter: a busy emitting thread can be
# descheduled for hundreds of ms on an overloaded machine, and waking the flusher thread then
# means a GIL handoff that stalls the emitter when it runs again.
FALLBACK_MIN_S = 1.0


# ------------------------------------------------------------------------------ framing
def send(fd: int, obj) -> None:
    """Write one length-prefixed pickled message (blocks, GIL released, when the pipe is full)."""
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LEN.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, alive=None, poll_s: float = 0.5) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        if alive is not None:
            if not wait_readable(fd, poll_s):
                if not alive():
                    return None
                continue
        chunk = os.read(fd, n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def recv(fd: int, alive=None):
    """One message, or None at end of file (or when ``alive()`` turns False while waiting)."""
    head = _read_exact(fd, _LEN.size, alive)
    if head is None:
        return None
    body = _read_exact(fd, _LEN.unpack(head)[0], alive)
    return None if body is None else pickle.loads(body)


NOT_YET = object()  # ``Replies.next(block=False)``: no complete message has arrived


class Replies:
    """The drain's replies, read without waiting unless asked (the server's side).

    The recorder's flusher thread hands a buffer over and goes back to sleep instead of waiting
    for the reply: every wait that ends takes the GIL back from the emitting thread, and on a
    busy machine such a handoff can leave the emitter stalled until this thread gets a CPU. The
    replies of timed flushes are applied at the next wake-up, when they have long arrived (the
    drain answers a message before it sends its next notice)."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self.buf = bytearray()
        self.eof = False

    def _frame(self):
        if len(self.buf) < _LEN.size:
            return NOT_YET
        n = _LEN.unpack_from(self.buf)[0]
        if len(self.buf) < _LEN.size + n:
            return NOT_YET
        body = bytes(self.buf[_LEN.size : _LEN.size + n])
        del self.buf[: _LEN.size + n]
        return pickle.loads(body)

    def next(self, block: bool):
        """The next reply; ``NOT_YET`` when none is complete and not ``block``; None at end of
        file (the drain exited)."""
        while True:
            msg = self._frame()
            if msg is not NOT_YET:
                return msg
            if self.eof:
                return None
            if block:
                wait_readable(self.fd)
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                if not block:
                    return NOT_YET
                continue
            if not chunk:
                self.eof = True
            self.buf += chunk


def at_step_boundary(fn, ctl: mmap.mmap, handover):
    """``fn`` (``tick``/``set_clock``) that then hands buffers over when the drain asked for it
    (``ctl[0]``): in the emitting thread, at a step boundary, so that no other thread of the
    server takes the GIL in steady state (~30 ns per call when nothing is asked)."""
    def at_step(*args):
        t = fn(*args)
        if ctl[0]:
            handover()
        return t

    at_step.__name__ = at_step.__qualname__ = fn.__name__
    at_step.__doc__ = fn.__doc__
    return at_step


# Appended to the generated ``sched`` emit in this mode: a server's hooks emit a ``sched`` step
# row at every step, and not always ``tick()`` (the flag check costs ~20 ns per ``sched`` row).
STEP_CHECK = "    if ctl[0]:\n        handover()\n"


def widen_pipe(fd: int, nbytes: int = 1 << 20) -> None:
    """Best effort: a pipe of ``nbytes`` (Linux), so that a message with many rows is written
    without waiting for the drain to read (a wait ends in a GIL handoff, see ``Replies``)."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), nbytes)
    except (OSError, ImportError):
        pass


# ------------------------------------------------------------------------------ shared buffers
def shared_buffer(nbytes: int, name: str, commit: bool = True) -> tuple[int, mmap.mmap]:
    """A zeroed ``memfd`` of ``nbytes`` mapped shared; ``commit``: its pages faulted in now (in
    the caller's thread, so the emitter never takes a page fault there; buffers are recycled,
    so a lazily faulted one costs its faults once)."""
    fd = os.memfd_create(f"kvtrace-{name}", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    if not commit:
        return fd, m
    view = np.frombuffer(m, np.uint8)
    for start in range(0, nbytes, 1 << 20):
        view[start : start + (1 << 20)] = 0
    del view
    return fd, m


def start_drain(config: dict, pass_fds: list[int]) -> subprocess.Popen:
    """Start ``python -m tracer.drain`` with ``config`` on its stdin (spawned, never forked)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from tracer.drain import main; sys.exit(main())"], stdin=subprocess.PIPE,
                            pass_fds=pass_fds, env=env, close_fds=True)
    proc.stdin.write(pickle.dumps(config))
    proc.stdin.close()
    return proc


# ------------------------------------------------------------------------------ the drain process
class Drain(SegmentWriter):
    """The drain process's writer: the recorder's segment and conversion code
    (``tracer.writer.SegmentWriter``), fed by messages."""

    def __init__(self, cfg: dict):
        from tracer import buffers as _buffers
        from tracer.options import RecorderOptions
        from tracer.schema import FAMILIES

        _buffers.HOLD_BUDGET_NS = 1 << 62  # nothing here waits for the GIL: never nap
        self.dir = cfg["dir"]
        self.rank = cfg["rank"]
        self.opts = RecorderOptions(**cfg["options"])
        self.structs = {}
        self.maps = {}
        for name, spec in cfg["structs"].items():
            maps = [mmap.mmap(fd, spec["nbytes"], flags=mmap.MAP_SHARED,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE) for fd in spec["fds"]]
            for fd in spec["fds"]:
                os.close(fd)
            self.maps[name] = maps
            self.structs[name] = _buffers.StructBuffer(FAMILIES[name], spec["capacity"],
                                                       ts_in_record=spec["ts_in_record"], shared=maps)
        self.segments = {}
        self.segment_opened_s = {}
        self.events_written = {f: 0 for f in FAMILIES}
        self.drops = _buffers.Drops()  # torn records, handed back to the server to count
        self.mark_carry = (np.zeros(1, np.int64), np.full(1, cfg["now0"], np.int64))

    def flush(self, msg: dict) -> dict:
        from tracer.schema import FAMILIES
        swapped: dict[str, list] = {}
        index: dict[int, int] = {}
        for name, idx, n, side in msg["bufs"]:
            buf = (self.maps[name][idx], _Fixed(n), side)
            index[id(buf)] = idx
            swapped.setdefault(name, []).append(buf)
        marks = None
        if swapped:
            self.marks = list(msg["marks"])
            marks = self._take_marks(swapped, msg["s_swap"])
        released = []
        for name, lst in swapped.items():
            b = self.structs[name]
            for buf in lst:
                n = buf[1].n
                torn = self._write_struct(name, b, buf, n, marks) if n else 0
                if torn:  # a writer was preempted between reserving and packing: let it finish
                    time.sleep(0.5)
                view = np.frombuffer(buf[0], np.uint8)
                view[: (b.capacity if torn else n) * b.size] = 0
                del view
                released.append((name, index[id(buf)]))
        for name, rows in msg["rows"].items():
            if rows:
                schema = FAMILIES[name].arrow_schema(stored=False)
                cols = list(zip(*rows))
                arrays = [pa.array(c, type=f.type) for c, f in zip(cols, schema)]
                self._segment(name).write(pa.RecordBatch.from_arrays(arrays, schema=schema))
                self.events_written[name] += len(rows)
        self._rotate(force_close=bool(msg.get("close")))
        torn = [(fam, reason, first, last, n) for (fam, reason), (first, last, n, _d)
                in self.drops.take().items()]
        return {"released": released, "written": dict(self.events_written), "torn": torn}

    def half_full(self) -> bool:
        """Whether a ring buffer has its middle record written (the server's flusher then swaps
        it: the drain watches fill levels so that the server's thread never polls)."""
        for name, b in self.structs.items():
            off = (b.capacity // 2) * b.size + b.dtype.fields["seq"][1]
            for m in self.maps[name]:
                if m[off : off + 8] != b"\0" * 8:
                    return True
        return False

    def abandon(self) -> None:
        for seg in self.segments.values():
            seg.abandon()
        self.segments.clear()


class _Fixed:
    """Stand-in for a buffer's slot counter: ``reserved()`` peeks it (``count(n * size)``)."""

    def __init__(self, n: int):
        self.n = n


def _reserved_patch(structs: dict) -> None:
    for b in structs.values():
        size, cap = b.size, b.capacity
        b.reserved = lambda buf, size=size, cap=cap: min(buf[1].n, cap)


def _server_died(drain: Drain, failed: str | None) -> None:
    """Close and convert what was handed over (``kvtrace recover`` then only marks the end)."""
    if failed is None:
        try:
            drain._rotate(force_close=True)
        except Exception:
            drain.abandon()


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the server decides when recording ends
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit is a write error
    cfg = pickle.loads(sys.stdin.buffer.read())
    from tracer.schema import manifest as _manifest
    cmd_fd, reply_fd, lock_fd, ppid = cfg["cmd_fd"], cfg["reply_fd"], cfg.get("lock_fd"), cfg["ppid"]
    drain = Drain(cfg)
    _reserved_patch(drain.structs)
    failed = None
    try:
        send(reply_fd, {"ready": os.getpid()})
    except OSError:
        return 1
    notice_fd, info = cfg["notice_fd"], cfg["info"]
    flushed_seq = 0
    os.set_blocking(notice_fd, False)
    interval_s = drain.opts.flush_interval_ms / 1000
    poll_s = min(drain.opts.poll_interval_ms / 1000, interval_s)
    ctl = None
    if cfg.get("ctl_fd") is not None:
        ctl = mmap.mmap(cfg["ctl_fd"], CTL_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(cfg["ctl_fd"])
    last_flush, noted, asked_at = time.monotonic(), set(), None
    fallback_s = max(interval_s, FALLBACK_MIN_S)

    def notice(kind: bytes) -> None:
        if kind not in noted:
            noted.add(kind)
            try:
                os.write(notice_fd, kind)
            except OSError:
                pass

    while True:
        if not wait_readable(cmd_fd, poll_s):
            if os.getppid() == ppid:
                now = time.monotonic()
                kind = DUE if now - last_flush >= interval_s else 0
                if not kind and failed is None and drain.half_full():
                    kind = HALF
                if kind:
                    # Ask the emitting thread first (a flag it reads at its next step boundary:
                    # no GIL handoff); wake the recorder's flusher thread only when no step
                    # boundary came for ``fallback_s`` (an idle or non-ticking server).
                    asked_at = now if asked_at is None else asked_at
                    if ctl is not None and ctl[0] != DUE:
                        ctl[0] = kind
                    if ctl is None or now - asked_at >= fallback_s:
                        notice(bytes([kind]))
                continue
            msg = None
        else:
            msg = recv(cmd_fd)
        last_flush, asked_at = time.monotonic(), None
        noted.clear()
        if msg is None:  # the server died: keep what it handed over, convert, exit
            _server_died(drain, failed)
            break
        if msg.get("exit"):
            break
        if failed is not None:
            reply = {"failed": failed, "released": [], "written": dict(drain.events_written), "torn": []}
        else:
            try:
                reply = drain.flush(msg)
                if msg.get("info") is not None:  # the recorder's rank info changed (coverage)
                    info = msg["info"]
                if msg.get("progress") or msg.get("info") is not None:
                    # every seq up to flushed_seq is on disk or counted (advisory)
                    flushed_seq = msg.get("progress") or flushed_seq
                    try:
                        _manifest.update_rank_info(drain.dir, drain.rank, dict(info, flushed_seq=flushed_seq))
                    except Exception:
                        pass
            except Exception as e:  # disk full, directory removed, ...
                failed = f"{type(e).__name__}: {e}"
                drain.abandon()
                reply = {"failed": failed, "released": [], "written": dict(drain.events_written), "torn": []}
        try:
            send(reply_fd, reply)
        except OSError:  # the server died while this message was being written
            _server_died(drain, failed)
            break
    if lock_fd is not None:
        try:
            os.close(lock_fd)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
