"""A flush cuts a buffer into chunks (every kept row once, in seq order, with its page ids) and
hands the GIL over, insisting while emitters are busy."""

from __future__ import annotations

import os
import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from replay.trace import open_trace
from tracer import buffers
from tracer.chunks import SideIndex, positions, row_chunks, written_mask
from tracer.schema import FAMILIES, Pool, PoolOp


def _noop():
    pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), unique=True, min_size=1, max_size=60), st.data())
def test_row_chunks_give_every_kept_row_once_in_seq_order(seq_list, data):
    seqs = np.array(seq_list, np.int64)
    torn_at = data.draw(st.lists(st.integers(0, len(seqs) - 1), unique=True, max_size=5))
    seqs[torn_at] = 0
    keep = written_mask(seqs, _noop, rows=3)
    assert keep.tolist() == (seqs != 0).tolist()
    rows = data.draw(st.integers(1, 8))
    chunks = [positions(c) for c in row_chunks(seqs, keep, int((~keep).sum()), _noop, rows=rows)]
    assert all(0 < len(c) <= rows for c in chunks)
    pos = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    assert sorted(pos.tolist()) == np.flatnonzero(keep).tolist()
    assert seqs[pos].tolist() == sorted(seqs[keep].tolist())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), unique=True, max_size=25), st.data())
def test_side_index_maps_page_ids_to_their_rows_in_a_chunk(rows_with_ids, data):
    side = [(r, [r, r + 1000]) for r in rows_with_ids]  # in whatever order threads appended
    pos = np.array(data.draw(st.lists(st.integers(0, 40), unique=True, min_size=1, max_size=20)), np.int64)
    entries = SideIndex(list(side), _noop, rows=4).entries(pos)
    assert [i for i, _ in entries] == sorted(i for i, _ in entries)  # page_ids_column needs row order
    got = {int(pos[i]): ids for i, ids in entries}
    assert got == {r: ids for r, ids in side if r in set(pos.tolist())}


def test_big_flush_goes_out_in_chunks_with_page_ids_in_place(tmp_path):
    n = 150_000  # > 2 messages of 65,536 rows
    rec = tracer.start(tmp_path / "t", buffer_events=1 << 18, flush_interval_ms=60_000, detail="pages")
    for i in range(n):
        tracer.pool_ids(Pool.FULL, PoolOp.ALLOC, i, 2, 1, 0, [i % 7, i])
    tracer.stop()
    rec.check_integrity()
    t = open_trace(tmp_path / "t").table("pool")
    assert t.num_rows == n
    assert t.column("seq").to_pylist() == sorted(t.column("seq").to_pylist())
    assert t.column("page_ids").to_pylist() == [[i % 7, i] for i in range(n)]


def test_threads_interleaving_still_flush_in_seq_order_with_their_page_ids(tmp_path):
    tracer.start(tmp_path / "t", buffer_events=1 << 17, flush_interval_ms=60_000, detail="pages")
    n = 30_000

    def work(k):
        for i in range(n):
            tracer.pool_ids(Pool.SWA, PoolOp.FREE, k * n + i, 1, 1, 0, [k * n + i])

    ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tracer.stop()
    t = open_trace(tmp_path / "t").table("pool")
    assert t.num_rows == 3 * n
    seqs = t.column("seq").to_pylist()
    assert seqs == sorted(seqs)
    assert t.column("page_ids").to_pylist() == [[r] for r in t.column("rid").to_pylist()]


def test_spare_buffers_are_zero_and_not_shared_with_a_forked_child():
    b = buffers.StructBuffer(FAMILIES["pool"], 1 << 10)
    data = b._new()[0]
    assert len(data) == (1 << 10) * b.size and not any(data[: b.size * 4])
    pid = os.fork()
    if pid == 0:  # the child writes into its copy only
        data[0] = 1
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert data[0] == 0


def test_handoff_insists_only_while_emitters_are_busy():
    calls = []

    def probe_changing_after(k):
        def probe():
            calls.append(1)
            return 0 if len(calls) <= k else 1
        return probe

    try:
        buffers.set_progress_probe(probe_changing_after(3))  # idle so far: one nap, no insisting
        buffers.handoff()
        assert len(calls) == 2 and buffers._progress[1] is False
        calls.clear()
        buffers._progress[1] = True  # emitters ran at the last handoff: nap until they run again
        buffers.handoff()
        assert len(calls) == 5 and buffers._progress[1] is True
        calls.clear()
        buffers.set_progress_probe(lambda: calls.append(1) or 0)  # busy, then never progresses
        buffers._progress[1] = True
        buffers.handoff()  # gives up after HANDOFF_MAX_S, and insists no more next time
        assert buffers._progress[1] is False and len(calls) >= 3
    finally:
        buffers.set_progress_probe(None)


def test_a_stopping_flusher_leaves_a_newer_recorders_probe_alone():
    def mine():
        return 0

    def newer():
        return 1

    try:
        buffers.set_progress_probe(newer)
        buffers.set_progress_probe(None, only_if=mine)
        assert buffers._progress[0] is newer
        buffers.set_progress_probe(None, only_if=newer)
        assert buffers._progress[0] is None
    finally:
        buffers.set_progress_probe(None)
