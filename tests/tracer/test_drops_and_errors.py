"""Losses are never silent: full buffers, write errors, and stop all leave drops rows."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import tracer
from replay.trace import open_trace
from tracer.buffers import MAX_BUFFERS
from tracer.schema import Pool, PoolOp


def test_burst_into_tiny_buffer_records_drops(tmp_path):
    # 16-record buffers and a flusher that never wakes on its own: a burst must overflow.
    rec = tracer.start(tmp_path / "t", buffer_events=16, flush_interval_ms=60_000, poll_interval_ms=60_000)
    n = 5000
    for i in range(n):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    written = tr.rows("pool")
    drops = tr.table("drops").to_pylist()
    assert written < n
    assert sum(d["num_events"] for d in drops) == n - written == rec.drops.total
    assert {d["family"] for d in drops} == {"pool"}
    assert {d["reason"] for d in drops} == {"buffer_full"}
    # every seq issued is a pool row, a drops row (drops rows take seqs from the same counter,
    # so a drops row flushed while the flusher kept up sits between kept pool rows) or inside a
    # recorded drop range
    kept = set(tr.table("pool").column("seq").to_pylist())
    drop_rows = {d["seq"] for d in drops}
    ranges = [(d["first_seq"], d["last_seq"]) for d in drops]
    issued = n + len(drops)
    lost = [s for s in range(1, issued + 1)
            if s not in kept and s not in drop_rows and not any(a <= s <= b for a, b in ranges)]
    assert lost == []
    assert max(kept | drop_rows) <= issued
    assert any(p.kind == "drops" for p in tr.check())


def _held(b) -> int:
    """Bytes in the family's current, pending and spare buffers (not those being flushed)."""
    return len(b.cur[0][0]) + sum(len(p[0]) for p in b.pending) + sum(len(f[0]) for f in b.free)


def test_memory_is_bounded_by_the_buffer(tmp_path):
    rec = tracer.start(tmp_path / "t", buffer_events=64, flush_interval_ms=60_000, poll_interval_ms=60_000)
    b = rec.structs["pool"]
    for i in range(10_000):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
    assert _held(b) <= (MAX_BUFFERS + 1) * 64 * b.size
    tracer.stop()


def test_an_emitter_outrunning_the_flusher_drops_instead_of_growing(tmp_path):
    # 64-event buffers: the flusher, woken at every full buffer, writes far slower than the
    # emitter fills them. The family's buffers must stay within MAX_BUFFERS (+1 during a swap);
    # before the cap each flush that found no spare added a buffer for good.
    rec = tracer.start(tmp_path / "t", buffer_events=64, flush_interval_ms=1, poll_interval_ms=1)
    b = rec.structs["pool"]
    n, most = 200_000, 0
    for i in range(n):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        if i % 256 == 0:
            most = max(most, b.live)
            b.check_integrity()
    tracer.stop()
    assert most <= MAX_BUFFERS + 1
    tr = open_trace(tmp_path / "t")
    dropped = sum(d["num_events"] for d in tr.table("drops").to_pylist())
    assert tr.rows("pool") + dropped == n  # nothing lost uncounted


def test_directory_removed_while_recording_keeps_caller_running(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="kvtrace.tracer")
    rec = tracer.start(tmp_path / "t", flush_interval_ms=10)
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    tracer.flush()
    shutil.rmtree(tmp_path / "t")
    for i in range(1000):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)  # never raises
    tracer.stop()  # never raises
    assert rec.failed is not None
    assert "disabled after a write error" in caplog.text
    assert not tracer.is_active()


def test_unwritable_target_is_a_clear_error_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    try:
        tracer.start(blocker / "t")
    except OSError as e:
        assert str(blocker) in str(e)
    else:
        raise AssertionError("start into a path below a regular file must fail")
    assert not tracer.is_active()


_DISK_FULL_CHILD = textwrap.dedent("""
    import resource, signal, sys, tracer
    from tracer.schema import Pool, PoolOp
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # EFBIG instead of death
    tracer.start(sys.argv[1], flush_interval_ms=20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))   # the "disk" fills up
    for i in range(200_000):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1, 1, i)
    tracer.stop()
    print("caller finished", flush=True)
""")


def test_disk_full_disables_recorder_with_one_log_line_and_caller_finishes(tmp_path):
    out = subprocess.run([sys.executable, "-c", _DISK_FULL_CHILD, str(tmp_path / "t")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "caller finished" in out.stdout
    errors = [ln for ln in out.stderr.splitlines() if "disabled after a write error" in ln]
    assert len(errors) == 1, out.stderr
    assert "File too large" in errors[0]
    info = (tmp_path / "t" / "ranks" / "rank=0.json").read_text()
    assert '"state": "crashed"' in info


def test_concurrent_emits_from_threads_lose_nothing(tmp_path):
    tracer.start(tmp_path / "t", flush_interval_ms=5, buffer_events=4096)
    n_threads, n = 4, 20_000

    def work(k):
        for i in range(n):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, k * n + i, k + 1)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    written, dropped = tr.rows("pool"), tr.num_dropped
    assert written + dropped == n_threads * n
    rows = tr.table("pool")
    rids = rows.column("rid").to_pylist()
    assert len(set(rids)) == len(rids)
    assert all(r // n + 1 == s for r, s in zip(rids, rows.column("num_slots").to_pylist()))
    assert all(p.kind == "drops" for p in tr.check())
    seqs = [e.seq for e in tr.events(families=("pool",))]
    assert seqs == sorted(seqs) and len(seqs) == written


def test_fork_child_stays_off_by_default(tmp_path):
    tracer.start(tmp_path / "t")
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    pid = os.fork()
    if pid == 0:  # child: emits are no-ops, nothing of the parent's is written twice
        ok = not tracer.is_active()
        tracer.pool(Pool.FULL, PoolOp.ALLOC, 99, 1)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 2, 1)
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    assert tr.table("pool").column("rid").to_pylist() == [1, 2]
    assert tr.ranks == [0]


def test_fork_child_records_into_its_own_rank(tmp_path):
    tracer.start(tmp_path / "t", on_fork="child", flush_interval_ms=10)
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    pid = os.fork()
    if pid == 0:
        try:
            tracer.pool(Pool.FULL, PoolOp.ALLOC, 1000, 1)
            tracer.stop()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 2, 1)
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    assert tr.ranks == [0, 1]
    assert tr.table("pool", rank=0).column("rid").to_pylist() == [1, 2]
    assert tr.table("pool", rank=1).column("rid").to_pylist() == [1000]


def test_check_integrity_holds_while_the_flusher_writes(tmp_path):
    # 16-event buffers and a flusher that wakes every millisecond: it is nearly always swapping or
    # writing while this thread emits and checks; what it holds is counted (``_flushing``)
    rec = tracer.start(tmp_path / "t", buffer_events=16, flush_interval_ms=1, poll_interval_ms=1)
    for i in range(3000):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        rec.check_integrity()
    tracer.stop()
    rec.check_integrity()
    assert sum(rec.events_written.values()) - rec.events_written["drops"] + rec.drops.total == 3000


def test_check_integrity_after_every_event(tmp_path):
    rec = tracer.start(tmp_path / "t", buffer_events=16, flush_interval_ms=60_000, poll_interval_ms=60_000)
    for i in range(200):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        rec.check_integrity()
        if i % 50 == 0:
            tracer.flush()
            rec.check_integrity()
    tracer.stop()
    rec.check_integrity()
    assert sum(rec.events_written.values()) - rec.events_written["drops"] + rec.drops.total == 200


def test_peek_count_reads_the_next_value_without_taking_it():
    """Both ways to peek a counter (the cheap pickle form where Python has it, the repr) agree,
    for plain and stepped counters and past a C long, and neither advances the counter."""
    import itertools

    from tracer.buffers import _peek_by_reduce, _peek_by_repr, peek_count

    ways = [_peek_by_repr, peek_count] + ([_peek_by_reduce] if sys.version_info < (3, 12) else [])
    for start, step in ((0, 1), (1, 1), (41, 3), (2**40, 7), (2**70, 1)):  # (CPython fails at 2**63 - 1)
        c = itertools.count(start, step)
        for _ in range(3):
            want = start
            assert [peek(c) for peek in ways] == [want] * len(ways)
            assert next(c) == want
            start += step
