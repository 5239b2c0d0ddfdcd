"""The drain process (``RecorderOptions.flusher = "process"``, ``tracer.drain``): the server's
interpreter fills shared buffers, a spawned process writes and converts them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

import tracer
from replay.cli import main as cli
from replay.trace import open_trace
from tracer.schema import Pool, PoolOp


def _gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stop_flushes_everything_and_the_drain_exits(tmp_path):
    rec = tracer.start(tmp_path / "t", flusher="process", flush_interval_ms=60_000, poll_interval_ms=60_000)
    drain = rec._proc
    n = 20_000
    for i in range(n):
        if i % 100 == 0:
            tracer.tick()
            tracer.sched(1, i, 2, 32, 32, 9000)
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1, 0)
        tracer.cache(0, i, 1024, 128, 64)
    tracer.request(0, 1, 3, 1, 900, 100, 128, -1, "r", None)
    rec.check_integrity()
    tracer.stop()
    assert drain.returncode == 0  # reaped by stop()
    tr = open_trace(tmp_path / "t")
    assert tr.rows("pool") == tr.rows("cache") == n and tr.rows("sched") == n // 100 and tr.rows("request") == 1
    assert tr.table("pool").column("rid").to_pylist() == list(range(n))
    info = json.loads((tmp_path / "t" / "ranks" / "rank=0.json").read_text())
    assert info["state"] == "complete" and info["dropped"] == 0 and info["options"]["flusher"] == "process"
    assert info["events"]["pool"] == n and info["issued"] == 2 * n + n // 100 + 1
    assert not list((tmp_path / "t").glob("*/rank=*/*.arrows")) and tr.check() == []


def test_step_clock_stamps_match_the_thread_flusher(tmp_path):
    def record(out, flusher):
        tracer.start(out, flusher=flusher, clock="manual", buffer_events=1024, flush_interval_ms=60_000,
                     poll_interval_ms=60_000)
        for step in range(300):
            if step % 70 == 0:
                tracer.flush()  # marks carried across flushes
            tracer.set_clock(1000 * step)
            tracer.pool(Pool.SWA, PoolOp.ALLOC, step, 64, 1, 0)
            tracer.stats(step, 1, 65536, 1000, 2000, 3000, 4000)
        tracer.stop()
        return open_trace(out).table("pool").select(["ts_ns", "seq", "rid"]).to_pylist()

    thread = record(tmp_path / "a", "thread")
    assert record(tmp_path / "b", "process") == thread and len(thread) == 300


def test_ring_full_drops_are_counted(tmp_path):
    rec = tracer.start(tmp_path / "t", flusher="process", buffer_events=16, flush_interval_ms=60_000,
                       poll_interval_ms=60_000)
    n = 5000
    for i in range(n):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    drops = [d for d in tr.table("drops").to_pylist() if d["family"] == "pool"]
    assert 0 < rec.drops.total == sum(d["num_events"] for d in drops) == n - tr.rows("pool")
    assert {d["reason"] for d in drops} == {"buffer_full"}
    kept = set(tr.table("pool").column("seq").to_pylist())
    drop_seqs = set(tr.table("drops").column("seq").to_pylist())
    ranges = [(d["first_seq"], d["last_seq"]) for d in drops]
    assert all(s in kept or s in drop_seqs or any(lo <= s <= hi for lo, hi in ranges) for s in range(1, n + 1))


def test_two_recorders_in_one_process_are_refused(tmp_path):
    rec = tracer.start(tmp_path / "a", flusher="process")
    try:
        with pytest.raises(RuntimeError, match="already recording"):
            tracer.start(tmp_path / "b", flusher="process")
        tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 64, 1, 0)
    finally:
        tracer.stop()
    assert rec._proc.returncode == 0 and open_trace(tmp_path / "a").rows("pool") == 1


def test_bad_flusher_is_refused():
    with pytest.raises(ValueError, match="flusher must be 'process' or 'thread'"):
        tracer.RecorderOptions(flusher="fork")


_CHILD = textwrap.dedent("""
    import sys, tracer
    from tracer.schema import Pool, PoolOp
    rec = tracer.start(sys.argv[1], flusher="process", flush_interval_ms=60_000, poll_interval_ms=60_000)
    print(rec._proc.pid, flush=True)
    i = 0
    while True:
        for _ in range(997):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, i % 1000, 1, 7 * i)
            i += 1
        tracer.flush()                       # everything below i is with the drain now
        print(i, flush=True)
""")


def test_server_sigkill_the_drain_converts_what_it_received_and_exits(tmp_path):
    path = tmp_path / "t"
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    drain_pid = int(p.stdout.readline())
    flushed = 0
    for line in p.stdout:
        flushed = int(line)
        if flushed >= 30 * 997:
            break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert _gone(drain_pid), "the drain process outlived its server"
    assert not list(path.glob("*/rank=*/*.arrows")), "the drain left open segments"
    res = CliRunner().invoke(cli, ["recover", str(path), "--json"])  # marks the rank's end state
    assert res.exit_code == 0, res.output
    tr = open_trace(path)
    rids = tr.table("pool").column("rid").to_pylist()
    assert len(rids) >= flushed and rids == list(range(len(rids)))
    assert tr.table("pool").column("dur_ns").to_pylist() == [7 * i for i in rids]


_FULL_DISK_CHILD = textwrap.dedent("""
    import resource, signal, sys, tracer
    from tracer.schema import CacheOp, Pool, PoolOp, RequestEvent
    rec = tracer.start(sys.argv[1], flusher="process", flush_interval_ms=10)
    # a full disk for the drain only (EFBIG past 40 kB; the drain ignores SIGXFSZ)
    resource.prlimit(rec._proc.pid, resource.RLIMIT_FSIZE, (40_000, 40_000))
    n = 0
    for k in range(60):
        for i in range(300):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 16, 1, 7 * i)
            tracer.cache(CacheOp.MATCH, i, 16)
            n += 2
        tracer.request(RequestEvent.ARRIVAL, k, input_len=100)
        n += 1
        tracer.flush()
    drain = rec._proc
    tracer.stop()
    print(n, tracer.is_active(), drain.returncode)
""")


def test_disk_full_in_the_drain_disables_recording_and_counts_every_event(tmp_path):
    path = tmp_path / "t"
    p = subprocess.run([sys.executable, "-c", _FULL_DISK_CHILD, str(path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr  # the server is never broken by its recorder
    emitted, active, drain_rc = p.stdout.split()
    assert (active, drain_rc) == ("False", "0")
    assert p.stderr.count("disabled after a write error") == 1, p.stderr
    info = json.loads((path / "ranks" / "rank=0.json").read_text())
    assert info["state"] == "crashed" and "File too large" in info["error"]
    # every emitted event is written, dropped or counted lost in the rank file
    assert info["issued"] >= int(emitted) and info["lost"] > 0
    assert sum(info["events"].values()) + info["dropped"] + info["lost"] == info["issued"]


def test_no_shared_memory_falls_back_to_the_flusher_thread(tmp_path):
    code = textwrap.dedent("""
        import resource, signal, sys, tracer
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # memfds of 2+ MB refused
        rec = tracer.start(sys.argv[1], flusher="process", buffer_events=1 << 16)
        tracer.pool(0, 0, 1, 64, 1, 0)
        tracer.stop()
        print(rec._proc)
    """)
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["None"], p.stderr
    assert "could not start the drain process" in p.stderr and "using the flusher thread" in p.stderr
    assert open_trace(tmp_path / "t").rows("pool") == 1
