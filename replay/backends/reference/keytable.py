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


def build(workload, page_size: int) -> KeyTable:
    """The keys of every request of ``workload`` at ``page_size``: each request's whole planned
    sequence, keyed in arrival order as a run keys them (the same ``PageKeys``, the same donors).

    Raises:
        ValueError: two requests share a rid (a run could not tell their keys apart).
    """
    from replay.backends.sglang.tokens import TokenSynth

    requests = workload.requests
    rids = [int(w.rid) for w in requests]
    if len(set(rids)) != len(rids):
        raise ValueError(f"{workload.path}: request ids repeat; no key table")
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
    return KeyTable(page_size, rids, offsets, flat)


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
