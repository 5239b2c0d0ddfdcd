"""Every request's page keys at one page size, computed once for many runs of one workload.

A run of the reference backend keys each request's pages as it needs them
(:class:`replay.backends.reference.keys.PageKeys`): about a sixth of a production hour's replay.
The keys are a function of the workload and the page size only, so the runs of one sweep (a
plan's splits, a capacity sweep's sizes) would compute the same keys each. A sweep's zygote
computes them once (:func:`build`, each request's whole planned sequence: prompt then outputs)
and :func:`install`\\ s the table before it forks the runs; a run whose workload and page size
have a table (:func:`lookup`: the same workload object, which ``replay.workloads.preload_workload``
hands the forked run) reads its requests' keys from it (``PageKeys.take_from``). The table is
built by the same ``PageKeys`` a run uses, so a run reads the keys it would have computed
(``tests/reference/test_keytable.py``: identical figures with and without a table).
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path

import numpy as np

from replay.backends.reference.keys import KeyDonors, LazyPrompt, PageKeys, SequenceOrigins
from replay.backends.reference.request import output_plan


class KeyTable:
    """The page keys of each request of one workload at one page size.

    Args:
        page_size: tokens per page.
        rids: request numbers, in the table's order.
        offsets: int64, ``len(rids) + 1``: request ``i``'s keys are ``keys[offsets[i]:offsets[i+1]]``.
        keys: uint64, every request's keys concatenated.
    """

    def __init__(self, page_size: int, rids, offsets: np.ndarray, keys: np.ndarray) -> None:
        self.page_size = page_size
        self.row = {int(r): i for i, r in enumerate(rids)}
        self.offsets, self.keys = offsets, keys

    def of(self, rid: int) -> np.ndarray | None:
        """The keys of request ``rid`` (None: not in the table)."""
        i = self.row.get(rid)
        return None if i is None else self.keys[self.offsets[i]:self.offsets[i + 1]]

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.offsets.nbytes)

    def check_integrity(self) -> None:
        """Offsets ascend from 0 to the number of keys; one row per request.

        Raises:
            ValueError: on a violation.
        """
        o = self.offsets
        if len(o) != len(self.row) + 1 or o[0] != 0 or o[-1] != len(self.keys) or bool((np.diff(o) < 0).any()):
            raise ValueError("key table: offsets do not partition the keys one request each")


def build(workload, page_size: int, workers: int = 1) -> KeyTable:
    """The keys of every request of ``workload`` at ``page_size``: each request's whole planned
    sequence, keyed in arrival order as a run keys them (the same ``PageKeys``, the same donors).

    ``workers`` > 1 (a single-threaded process on Linux, as a sweep's zygote): the sessions are
    dealt to that many processes (forked, each keying its share with its own donors: a donor only
    saves work, the keys are the same), whose tables are joined.

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
        return _build(workload, page_size, requests)
    shares: list[list] = [[] for _ in range(workers)]
    for w in requests:  # whole sessions to one process (a turn's donor is its previous turn)
        sid = int(w.session_id)
        shares[(sid if sid >= 0 else int(w.rid)) % workers].append(w)
    with tempfile.TemporaryDirectory(prefix="kvtrace-keys-") as tmp:
        pids = [_fork_share(workload, page_size, share, Path(tmp) / f"{i}.npz") for i, share in enumerate(shares)
                if i > 0]
        tables = [_build(workload, page_size, shares[0])]
        for i, pid in enumerate(pids, 1):
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise RuntimeError(f"key table: worker {i} of {workers} exited with status "
                                   f"{os.waitstatus_to_exitcode(status)}")
            with np.load(Path(tmp) / f"{i}.npz") as z:
                tables.append(KeyTable(page_size, z["rids"].tolist(), z["offsets"], z["keys"]))
    return _join(page_size, tables)


#: fewer requests than this are keyed in one process (a fork costs more than it saves)
MIN_PARALLEL_REQUESTS = 2000


def _build(workload, page_size: int, requests) -> KeyTable:
    from replay.backends.sglang.tokens import TokenSynth

    synth = TokenSynth(workload)
    donors = KeyDonors(requests, synth._next_turn)
    offsets = np.zeros(len(requests) + 1, dtype=np.int64)
    parts = []
    for i, w in enumerate(requests):
        plan = output_plan(w)
        keys = PageKeys(LazyPrompt(synth, w, int(w.input_len)), page_size, plan, SequenceOrigins(synth, w))
        donors.adopt(keys, w)
        whole = keys.up_to(int(w.input_len) + len(plan))
        parts.append(np.array(whole, dtype=np.uint64))
        offsets[i + 1] = offsets[i] + len(whole)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    return KeyTable(page_size, [int(w.rid) for w in requests], offsets, flat)


def _fork_share(workload, page_size: int, share: list, path: Path) -> int:
    """A forked process keys ``share`` and saves its table to ``path``; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from replay.procs import die_with_parent

        die_with_parent(signal.SIGKILL)
        t = _build(workload, page_size, share)
        rids = np.array(sorted(t.row, key=t.row.get), dtype=np.int64)
        np.savez(path, rids=rids, offsets=t.offsets, keys=t.keys)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent reports the exit status
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _join(page_size: int, tables: list[KeyTable]) -> KeyTable:
    rids, offsets, keys, base = [], [np.zeros(1, dtype=np.int64)], [], 0
    for t in tables:
        rids += sorted(t.row, key=t.row.get)
        offsets.append(t.offsets[1:] + base)
        keys.append(t.keys)
        base += len(t.keys)
    return KeyTable(page_size, rids, np.concatenate(offsets), np.concatenate(keys))


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


__all__ = ["KeyTable", "build", "install", "lookup"]
