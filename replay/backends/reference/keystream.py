"""A run's key table keyed beside the run, by a forked process, while the run starts.

A run with no sweep's table keys every request before its first step
(:func:`replay.backends.reference.keytable.for_run`): on ``production_1h`` 1.2-1.5 s of a 14 s
figures-only replay, on one core of two while the other idles. :class:`KeyStream` forks a
process that keys the workload batch by batch (:func:`replay.backends.reference.keybatch.key_batches`:
the same plans, donors and digests; a first batch of :data:`FIRST_BATCH_PAGES` pages, each next
one twice as large) and hands each batch over in shared memory: its own keys (uint64) and each
request's plan (the request it adopts its leading keys from, how many, and where its own keys
are), then, through a pipe, how many requests and keys it has written. The run lists a whole
batch when it reaches the batch's first request (:meth:`KeyStream.of`): the batch's own keys as
ints in one ``tolist`` and each request's row as ``keybatch.list_batch`` makes it (its donor's
adopted keys, the donor's own int objects, then its own), so the keys, and which of them are
shared objects, are those of the table the run would have built first
(``tests/reference/test_keystream.py``).

Listing whole batches matters: a run that listed each request's keys at its arrival, interleaving
them with the tree's own objects, ran 0.7-1.0 s slower than one whose keys were listed in a few
large batches (docs/capacity.md, "Session 26"). The run waits only where it reaches a batch the
process has not keyed yet (the first one, ~50 ms).

Should the process fail or be killed, the run keys the rest itself (``keybatch.build_rows``) and
says why in :attr:`KeyStream.fallback`; the keys are the same either way. The process ignores
SIGINT (the run's own handling stops the run), dies with the run (``PR_SET_PDEATHSIG``), and is
killed and reaped by :meth:`KeyStream.close` (the backend's exit).
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import threading

import numpy as np

from replay.backends.reference import keybatch

#: the first batch the process keys (pages): the run's first requests wait only for it
FIRST_BATCH_PAGES = 65_536
#: fewer planned keys than this are keyed in the run's own process (a fork and the process's
#: start cost more than keying them: ``mixed``'s ~100 k keys take ~20 ms)
MIN_STREAM_PAGES = 1_000_000
_MSG = struct.Struct("<qq")  # requests keyed so far, keys written so far (one 16-byte write: atomic)
_META = 4  # per request: donor index (-1: none), adopted keys, own keys' offset, own keys' count
_ADVICE = getattr(mmap, "MADV_REMOVE", getattr(mmap, "MADV_DONTNEED", None))


def can_stream(planned: int) -> bool:
    """Whether a table of ``planned`` keys is worth a process, and one can be forked safely here
    (``os.fork`` and a single-threaded process: the keying process runs Python code)."""
    return planned >= MIN_STREAM_PAGES and hasattr(os, "fork") and threading.active_count() == 1


class KeyStream:
    """The keys of ``workload``'s requests at ``page_size``, keyed by a forked process.

    Args:
        workload: the workload (its ``requests`` in arrival order, rids unique).
        page_size: tokens per page.
        planned: at least the number of keys (``keytable.planned_pages``).
    """

    def __init__(self, workload, page_size: int, planned: int) -> None:
        self.workload, self.page_size = workload, page_size
        self.requests = workload.requests
        n = len(self.requests)
        self._index = {int(w.rid): i for i, w in enumerate(self.requests)}
        if len(self._index) != n:
            raise ValueError(f"{getattr(workload, 'path', 'workload')}: request ids repeat; no key stream")
        self._rows: list[list[int] | None] = [None] * n
        self._listed = 0  # requests listed: a prefix of ``requests``
        self._keys_listed = 0  # their own keys in the shared buffer
        self._released = 0  # bytes of the buffer given back
        self._batches: list[tuple[int, int]] = []  # published, not listed: (requests, keys) written by then
        self._partial = b""
        self.fallback: str | None = None  # why the run keyed the rest itself (None: it did not)
        self.waits = 0  # reads of the pipe that blocked the run
        self._keys_mm = mmap.mmap(-1, max(mmap.PAGESIZE, 8 * planned))
        self._meta_mm = mmap.mmap(-1, max(mmap.PAGESIZE, 8 * _META * n))
        self._keys = np.frombuffer(self._keys_mm, dtype=np.uint64)
        self._meta = np.frombuffer(self._meta_mm, dtype=np.int64)[:_META * n].reshape(n, _META)
        self._pid, self._read_fd = 0, -1
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            raise
        if pid == 0:  # the keying process: never returns
            os.close(r)
            _key_in_child(workload, page_size, self._keys, self._meta, w)
        os.close(w)
        self._pid, self._read_fd = pid, r

    # ---- the run's side ----------------------------------------------------------------

    def of(self, rid: int) -> list[int] | None:
        """The keys of request ``rid`` (None: not a request of the workload); lists the batches
        before it first (in arrival order), waiting for the process where it has not keyed them."""
        i = self._index.get(rid)
        if i is None:
            return None
        while self._listed <= i:
            if self.fallback is None and not self._batches:
                self._wait()
            if self.fallback is not None:
                self._list_fallback()
            else:
                self._list_batch(*self._batches.pop(0))
        return self._rows[i]

    def _wait(self) -> None:
        """Block until the process has written another batch (or is gone: ``fallback``)."""
        self.waits += 1
        while not self._batches:
            try:
                data = os.read(self._read_fd, 4096)
            except OSError as e:
                data, why = b"", f"reading its pipe failed ({e})"
            else:
                why = "it ended before keying every request"
            if not data:
                self.fallback = f"the keying process: {why} ({self._reap(kill=True)}); the run keyed the rest itself"
                return
            data = self._partial + data
            whole = len(data) - len(data) % _MSG.size
            self._batches.extend(_MSG.iter_unpack(data[:whole]))
            self._partial = data[whole:]

    def _list_batch(self, done: int, keys_end: int) -> None:
        """List the requests up to ``done`` (their own keys end at ``keys_end``)."""
        rows, meta = self._rows, self._meta
        k0 = self._keys_listed
        own_all = self._keys[k0:keys_end].tolist()
        for j in range(self._listed, done):
            donor, adopted, off, count = meta[j].tolist()
            rows[j] = keybatch.row_of(rows[donor] if donor >= 0 else None, adopted,
                                      own_all[off - k0:off - k0 + count])
        self._listed, self._keys_listed = done, keys_end
        self._release(keys_end * 8)
        if done == len(rows):
            self._release(len(self._keys_mm))
            self._reap(kill=False, wait=False)

    def _list_fallback(self) -> None:
        """Key every request not listed yet in this process (the same keys: ``build_rows``)."""
        rows = keybatch.build_rows(self.workload, self.page_size, self.requests)
        for j in range(self._listed, len(self.requests)):
            self._rows[j] = rows[int(self.requests[j].rid)]
        self._listed = len(self.requests)
        self._batches.clear()

    def _release(self, upto: int) -> None:
        """Give back the shared buffer's whole pages below byte ``upto`` (listed: never read again)."""
        upto = upto // mmap.PAGESIZE * mmap.PAGESIZE
        if upto > self._released and _ADVICE is not None:
            try:
                self._keys_mm.madvise(_ADVICE, self._released, upto - self._released)
            except (OSError, ValueError):  # pragma: no cover - an older kernel: kept until close
                return
            self._released = upto

    # ---- lifetime ----------------------------------------------------------------------

    def _reap(self, kill: bool, wait: bool = True) -> str:
        """Stop (``kill``) and reap the process (``wait=False``: only if it has exited); its end as words."""
        if not self._pid:
            return "reaped before"
        if kill:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pid, status = os.waitpid(self._pid, 0 if wait or kill else os.WNOHANG)
        if pid == 0:
            return "still running"
        self._pid = 0
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit status {os.waitstatus_to_exitcode(status)}"

    @property
    def running(self) -> bool:
        """Whether the keying process is still unreaped."""
        return bool(self._pid)

    def close(self) -> None:
        """Stop the process (killed if still keying) and reap it; close the pipe. Idempotent."""
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        if self._pid:
            self._reap(kill=True)

    def check_integrity(self) -> None:
        """Every listed row is a list of keys below 2^63, as long as its request's planned pages
        or shorter.

        Raises:
            ValueError: on a violation.
        """
        ps = self.page_size
        for j in range(self._listed):
            keys, w = self._rows[j], self.requests[j]
            if type(keys) is not list or (keys and not (0 <= min(keys) and max(keys) < 1 << 63)):
                raise ValueError(f"key stream: request {w.rid}: not a list of 63-bit keys")
            if len(keys) > (int(w.input_len) + max(int(w.output_len), 0)) // ps:
                raise ValueError(f"key stream: request {w.rid}: more keys than planned pages")


def _key_in_child(workload, page_size: int, keys: np.ndarray, meta: np.ndarray, fd: int) -> None:
    """The keying process: key every request batch by batch; after each batch, its own keys into
    ``keys``, its plans into ``meta``, then (requests, keys) written so far into ``fd``. Exits 0,
    or 1 after printing what failed."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's Ctrl-C is the run's to handle
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from replay.procs import die_with_parent

        die_with_parent(signal.SIGKILL)
        base, done = 0, 0
        for plans, own in keybatch.key_batches(workload, page_size, workload.requests, FIRST_BATCH_PAGES):
            keys[base:base + len(own)] = own
            for p in plans:
                meta[p.index] = (p.donor.index if p.donor is not None else -1, p.adopted, base + p.off, p.count)
            base += len(own)
            done += len(plans)
            os.write(fd, _MSG.pack(done, base))
        code = 0
    except BrokenPipeError:  # the run is done with us
        code = 0
    except BaseException:  # noqa: BLE001 - the run keys the rest itself and says so
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


__all__ = ["FIRST_BATCH_PAGES", "MIN_STREAM_PAGES", "KeyStream", "can_stream"]
