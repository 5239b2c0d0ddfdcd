"""Every request's page keys at one page size, computed once for many runs of one workload.

Keying a request's pages (:class:`replay.backends.reference.keys.PageKeys`) is about an eighth of
a production hour's replay. The keys are a function of the workload and the page size only, so
the runs of one sweep (a plan's splits, a capacity sweep's sizes) would compute the same keys
each. A run with no table keys every request before its first step (:func:`for_run`: the loop
that follows is faster than one keying each request as it reaches it, with the same keying
work; a large table is keyed by a forked process beside the run's first steps,
:mod:`replay.backends.reference.keystream`), or, past :data:`MAX_RUN_PAGES` keys, each request's
pages as it needs them. A sweep's zygote
computes them once (:func:`build`: each request's whole planned sequence, prompt then outputs)
and :func:`install`\\ s the table before it forks the runs; a run whose workload and page size
have a table (:func:`lookup`: the same workload object, which ``replay.workloads.preload_workload``
hands the forked run) reads its requests' keys from it (``PageKeys.take_from``). The table is
planned by the same ``PageKeys`` a run uses (donors, adopted pages, digest runs) and keyed in
batches (:mod:`replay.backends.reference.keybatch`: the digests and chains of many requests in a
few whole-array operations), so a run reads the keys it would have computed
(``tests/reference/test_keybatch.py``: the same ints; ``tests/reference/test_keytable.py``:
identical figures with and without a table).

The keys are Python lists whose equal leading keys are the same int objects across requests (a
session's turns, a shared system prompt), as a run's key donors make them: the tree compares a
request's keys with its nodes' (slices of earlier requests' lists) by identity first, and a
table of separate ints made the whole split 8 % slower than one that shares them.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path

import numpy as np

from replay.backends.reference.keybatch import build_rows as _build  # rid -> keys of requests, in order
from replay.backends.reference.keys import KeyDonors

#: fewer requests than this are keyed in one process (a fork costs more than it saves)
MIN_PARALLEL_REQUESTS = 2000


class KeyTable:
    """The page keys of each request of one workload at one page size.

    Args:
        page_size: tokens per page.
        rows: rid -> the keys of the request's whole planned sequence (a list of ints; callers
            copy, never mutate).
    """

    def __init__(self, page_size: int, rows: dict[int, list[int]]) -> None:
        self.page_size = page_size
        self.rows = rows

    def of(self, rid: int) -> list[int] | None:
        """The keys of request ``rid`` (None: not in the table)."""
        return self.rows.get(rid)

    @property
    def pages(self) -> int:
        return sum(len(k) for k in self.rows.values())

    def check_integrity(self) -> None:
        """Every row is a list of non-negative ints below 2^63.

        Raises:
            ValueError: on a violation.
        """
        for rid, keys in self.rows.items():
            if type(keys) is not list or (keys and not (0 <= min(keys) and max(keys) < 1 << 63)):
                raise ValueError(f"key table: request {rid}: not a list of 63-bit keys")


def build(workload, page_size: int, workers: int = 1, scratch: str | Path | None = None) -> KeyTable:
    """The keys of every request of ``workload`` at ``page_size``: each request's whole planned
    sequence, keyed in arrival order as a run keys them (the same ``PageKeys``, the same donors).

    ``workers`` > 1 (a single-threaded process on Linux, as a sweep's zygote): the sessions are
    dealt to that many processes (forked, each keying its share with its own donors: a donor only
    saves work, the keys are the same); the shares come back as arrays, and each of their
    requests takes the leading keys it has in common with its donor as the donor's objects.
    ``scratch``: where the shares pass through (a temporary directory made there; default the
    system's), e.g. the sweep's ``.partial``, which the next sweep clears should a kill -9 leave
    one behind.

    Raises:
        ValueError: two requests share a rid (a run could not tell their keys apart).
        RuntimeError: a worker process failed.
    """
    requests = workload.requests
    rids = [int(w.rid) for w in requests]
    if len(set(rids)) != len(rids):
        raise ValueError(f"{workload.path}: request ids repeat; no key table")
    if workers <= 1 or len(requests) < MIN_PARALLEL_REQUESTS or not hasattr(os, "fork") \
            or threading.active_count() != 1:
        return KeyTable(page_size, _build(workload, page_size, requests))
    shares: list[list] = [[] for _ in range(workers)]
    for w in requests:  # whole sessions to one process (a turn's donor is its previous turn)
        sid = int(w.session_id)
        shares[(sid if sid >= 0 else int(w.rid)) % workers].append(w)
    with tempfile.TemporaryDirectory(prefix="kvtrace-keys-", dir=scratch) as tmp:
        pids = [_fork_share(workload, page_size, share, Path(tmp) / f"{i}.npz") for i, share in enumerate(shares)
                if i > 0]
        rows = _build(workload, page_size, shares[0])
        for i, pid in enumerate(pids, 1):
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                raise RuntimeError(f"key table: worker {i} of {workers} exited with status {code}")
            with np.load(Path(tmp) / f"{i}.npz") as z:
                rows |= _shared_rows(workload, shares[i], z["offsets"], z["keys"])
    return KeyTable(page_size, rows)


def planned_pages(workload, page_size: int) -> int:
    """How many keys a table of ``workload`` at ``page_size`` holds, at most (every request's
    whole planned sequence, in whole pages or not)."""
    return sum(int(w.input_len) + max(int(w.output_len), 0) for w in workload.requests) // max(1, page_size)


def _fork_share(workload, page_size: int, share: list, path: Path) -> int:
    """A forked process keys ``share`` and saves its keys (concatenated, in ``share``'s order) to
    ``path``; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from replay.procs import die_with_parent

        die_with_parent(signal.SIGKILL)
        rows = _build(workload, page_size, share)
        lens = [len(rows[int(w.rid)]) for w in share]
        offsets = np.zeros(len(share) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        keys = np.fromiter((k for w in share for k in rows[int(w.rid)]), dtype=np.uint64, count=int(offsets[-1]))
        np.savez(path, offsets=offsets, keys=keys)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent reports the exit status
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


class _Shared:
    """A request's keys as an array and as the list built so far (``KeyDonors`` adopts onto it)."""

    __slots__ = ("arr", "keys", "donors")

    def __init__(self, arr: np.ndarray) -> None:
        self.arr, self.keys, self.donors = arr, [], ()

    def adopt_from(self, *donors) -> None:
        self.donors = tuple(d for d in donors if d is not None)


def _shared_rows(workload, share: list, offsets: np.ndarray, keys: np.ndarray) -> dict[int, list[int]]:
    """A worker's keys as lists, each request's leading keys in common with its donor (the one
    sharing most, as ``KeyDonors`` picks them) the donor's own int objects."""
    from replay.backends.sglang.tokens import TokenSynth

    donors = KeyDonors(share, TokenSynth(workload)._next_turn)
    rows = {}
    for i, w in enumerate(share):
        me = _Shared(keys[offsets[i]:offsets[i + 1]])
        donors.adopt(me, w)
        best, common = None, 0
        for d in me.donors:
            m = min(len(me.arr), len(d.arr))
            diff = np.flatnonzero(me.arr[:m] != d.arr[:m])
            n = int(diff[0]) if len(diff) else m
            if n > common:
                best, common = d, n
        me.keys = (best.keys[:common] if best is not None else []) + me.arr[common:].tolist()
        rows[int(w.rid)] = me.keys
    return rows


#: the most page keys a run keys before it starts (:func:`for_run`; a list entry and an int each,
#: ~40 B: ~1.3 GB); a workload with more keys is keyed as the run reaches its requests
MAX_RUN_PAGES = 32_000_000


def for_run(workload, page_size: int):
    """The keys one run of ``workload`` reads, or None (it keys each request as it needs its
    pages, :class:`PageKeys` with ``KeyDonors``): every request's, as a sweep's zygote keys them,
    when they number at most :data:`MAX_RUN_PAGES` and the rids are unique. From
    ``keystream.MIN_STREAM_PAGES`` keys on (where a process can be forked), a forked process
    keys them while the run starts (a :class:`replay.backends.reference.keystream.KeyStream`,
    which the run closes); fewer are keyed before the run's first step (a :class:`KeyTable`).
    Measured on ``production_1h`` (figures-only, swa-fixes): 16.4 s with the keys taken first
    (2.2 s of it keying), 18.1 s keying each request at its arrival, with the same keying work
    (docs/capacity.md, "Session 24"); keyed beside the run, 1.08x less wall than taken first
    ("Session 26"). The keys are kept for the run's length (+180 MB there)."""
    from replay.backends.reference import keystream

    planned = planned_pages(workload, page_size)
    if planned > MAX_RUN_PAGES:
        return None
    try:
        if keystream.can_stream(planned):
            try:
                return keystream.KeyStream(workload, page_size, planned)
            except OSError:  # no process or shared memory to be had: keyed first
                pass
        return build(workload, page_size)
    except ValueError:  # rids repeat: each request keyed as the run reaches it
        return None


#: (workload, table) pairs installed in this process (a sweep's zygote, and the runs it forks)
_TABLES: list[tuple[object, KeyTable]] = []


def install(workload, table: KeyTable) -> None:
    """Make ``table`` the keys of ``workload`` (this object) at its page size in this process."""
    _TABLES[:] = [(w, t) for w, t in _TABLES if not (w is workload and t.page_size == table.page_size)]
    _TABLES.append((workload, table))


def lookup(workload, page_size: int) -> KeyTable | None:
    """The table installed for ``workload`` (this very object) at ``page_size``, or None."""
    for w, t in _TABLES:
        if w is workload and t.page_size == page_size:
            return t
    return None


__all__ = ["MAX_RUN_PAGES", "MIN_PARALLEL_REQUESTS", "KeyTable", "build", "for_run", "install", "lookup", "planned_pages"]
