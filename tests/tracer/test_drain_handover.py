"""The drain process's hand-over without waiting (``tracer.drain.Replies``): a timed flush sends
the buffers and returns; the drain's reply is applied at a later flush. Accounting stays exact
meanwhile, and a drain that dies disables recording with every event counted."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import tracer
from replay.trace import open_trace
from tracer.schema import Pool, PoolOp


def _start(path, **kw):
    opts = dict(flusher="process", buffer_events=4096, flush_interval_ms=60_000, poll_interval_ms=60_000)
    opts.update(kw)
    rec = tracer.start(path, **opts)
    assert rec._proc is not None, "the drain process did not start"
    return rec


def test_a_flush_that_does_not_wait_counts_its_events_in_flight_until_the_reply(tmp_path):
    rec = _start(tmp_path / "t")
    try:
        for i in range(1000):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1, 0)
        assert rec.flush(force=True, wait=False)
        assert rec._awaited == [1000] and rec._inflight == 1000
        rec.check_integrity()  # in flight counts as buffered: issued = written + dropped + buffered
        for i in range(1000, 1500):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1, 0)
        assert rec.flush(force=True)  # waits for both replies, the first one applied first
        assert rec._awaited == [] and rec._inflight == 0
        assert rec.events_written["pool"] == 1500
        rec.check_integrity()
    finally:
        tracer.stop()
    assert open_trace(tmp_path / "t").table("pool").column("rid").to_pylist() == list(range(1500))


def test_flushes_sent_faster_than_the_drain_answers_lose_nothing(tmp_path):
    """Three hand-overs before any reply is read: the ring's three buffers are all with the
    drain or current; a swap that finds no free buffer keeps the current one."""
    rec = _start(tmp_path / "t")
    n = 0
    try:
        for _ in range(3):
            for _k in range(700):
                tracer.pool(Pool.SWA, PoolOp.FREE, n, 64, 1, n)
                n += 1
            assert rec.flush(force=True, wait=False)
            rec.check_integrity()
        assert sum(rec._awaited) == rec._inflight <= 3 * 700
        rec.check_integrity()
    finally:
        tracer.stop()
    tr = open_trace(tmp_path / "t")
    assert rec.drops.total == 0 and tr.rows("pool") == n == 2100
    assert tr.table("pool").column("dur_ns").to_pylist() == list(range(n)) and tr.check() == []


def test_a_drain_that_dies_disables_recording_and_every_event_is_counted(tmp_path, caplog):
    rec = _start(tmp_path / "t")
    for i in range(500):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1, 0)
    assert rec.flush(force=True)
    os.kill(rec._proc.pid, signal.SIGKILL)
    rec._proc.wait(timeout=30)
    for i in range(500, 800):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1, 0)
    assert rec.flush(force=True, wait=False) is False  # the hand-over finds the drain gone
    assert not tracer.is_active()
    for _ in range(7):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, 0, 64, 1, 0)  # counted as lost, never raises
    tracer.stop()
    info = json.loads((tmp_path / "t" / "ranks" / "rank=0.json").read_text())
    assert info["state"] == "crashed" and "drain process exited" in info["error"]
    assert info["events"]["pool"] == 500 and info["issued"] == 807 + 1  # + the write-error drops row
    assert sum(info["events"].values()) + info["dropped"] + info["lost"] == info["issued"]


def _flush_threads(rec) -> list[str]:
    """Record the thread of every hand-over to the drain (wraps the instance's method)."""
    names, inner = [], rec._flush_process

    def flush_process(*a, **k):
        names.append(threading.current_thread().name)
        return inner(*a, **k)

    rec._flush_process = flush_process
    return names


def test_timed_flushes_happen_in_the_emitting_thread_at_step_boundaries(tmp_path):
    rec = _start(tmp_path / "t", flush_interval_ms=50, poll_interval_ms=10)
    names = _flush_threads(rec)
    n, end = 0, time.monotonic() + 60
    while len(names) < 5 and time.monotonic() < end:  # the drain asks every 50 ms (load permitting)
        for _ in range(50):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, n, 64, 1, 0)
            n += 1
        tracer.tick()  # a step boundary: the drain's request is answered here
        time.sleep(0.002)
    timed = list(names)
    tracer.stop()
    assert len(timed) >= 5 and set(timed) == {"MainThread"}, timed  # the flusher thread never woke
    assert open_trace(tmp_path / "t").rows("pool") == n and rec.drops.total == 0


def test_without_step_boundaries_the_flusher_thread_flushes_after_a_flush_interval(tmp_path):
    rec = _start(tmp_path / "t", flush_interval_ms=100, poll_interval_ms=10)
    names = _flush_threads(rec)
    for i in range(100):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1, 0)  # no tick: an idle or non-ticking server
    deadline = time.monotonic() + 30
    while rec.events_written["pool"] < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rec.events_written["pool"] == 100 and names and set(names) == {"kvtrace-flusher"}, names
    tracer.stop()


def test_a_sched_step_row_is_a_step_boundary_too(tmp_path):
    """A server's hooks emit a ``sched`` row per step (not always ``tick()``): same signature,
    keywords included, and the drain's request is answered there."""
    rec = _start(tmp_path / "t", flush_interval_ms=50, poll_interval_ms=10)
    names = _flush_threads(rec)
    fct, end = 0, time.monotonic() + 60
    while len(names) < 5 and time.monotonic() < end:
        fct += 1
        tracer.pool(Pool.FULL, PoolOp.ALLOC, fct, 64, 1, 0)
        tracer.sched(1, fct, 2, batch_size=8, num_tokens=8, rid=fct, verdict=1)
        time.sleep(0.002)
    timed = list(names)
    tracer.stop()
    assert len(timed) >= 5 and set(timed) == {"MainThread"}, timed
    sched = open_trace(tmp_path / "t").table("sched").to_pylist()
    assert [r["forward_ct"] for r in sched] == list(range(1, fct + 1))
    assert {(r["batch_size"], r["rid"] - r["forward_ct"], r["verdict"]) for r in sched} == {(8, 0, "admitted")}
