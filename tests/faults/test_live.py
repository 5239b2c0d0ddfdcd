"""Signals at random points of a live recording (a process that calls ``tracer.start`` and
emits), and recover racing it. Every case ends with: the trace says how it ended, recover keeps
everything on disk and counts the rest, and ``inspect --strict`` agrees."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.faults.util import LIVE_CHILD, accounting, assert_clean_failure, data_events, no_temporaries, run


def _start(path, flush_ms=1000):
    return subprocess.Popen([sys.executable, "-c", LIVE_CHILD, str(path), str(flush_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _emitted_are_on_disk(acc, emitted):
    """The child counts an emit after it returns, so a KeyboardInterrupt between a loop's emits
    and its count leaves up to two events on disk that the child's ``final`` does not count (the
    pool and cache rows of one iteration). None may be missing, and the tracer's own books
    (written, issued, max seq) must agree exactly."""
    return (emitted <= data_events(acc) <= emitted + 2 and acc["dropped"] == 0
            and acc["written"] == acc["info"]["issued"] == acc["max_seq"])


def _read_until(p, rounds):
    last = 0
    for _ in range(rounds):
        line = p.stdout.readline()
        if not line:
            break
        last = int(line)
    return last


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_a_random_point_loses_nothing_uncounted(tmp_path, seed):
    rnd = random.Random(seed)
    path = tmp_path / "t"
    p = _start(path, flush_ms=rnd.choice([5, 50, 60_000]))
    flushed = _read_until(p, rnd.randint(3, 30))
    time.sleep(rnd.random() * 0.02)
    p.kill()
    _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL

    res = run("inspect", "--strict", path)  # before recovery: an open segment, a crashed rank
    assert_clean_failure(res, "problem(s) found by the strict checks", code=1)
    assert "crashed" in res.stdout

    res = run("recover", "--json", path)
    assert "Traceback" not in res.stderr
    out = json.loads(res.stdout)
    acc = accounting(path)
    issued = max(acc["max_seq"], acc["info"].get("issued", 0))
    assert acc["written"] + acc["dropped"] == issued  # every seq up to the last one known: on disk or counted
    assert data_events(acc) >= flushed  # everything flushed before the kill is kept
    assert res.returncode == (1 if out["lost"] else 0)
    assert acc["info"]["state"] == "recovered" and acc["info"]["recovered_from"] == "crashed"
    res = run("inspect", "--strict", "--json", path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    s = json.loads(res.stdout)
    assert s["state"] == "recovered"
    assert not [q for q in s["problems"] if "neither on disk nor counted" in q]
    assert no_temporaries(path) == []


@pytest.mark.parametrize("sig,state", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "crashed")])
def test_sigint_and_sigterm_of_a_live_recording(tmp_path, sig, state):
    """SIGINT: the interpreter exits through KeyboardInterrupt, the recorder flushes at exit and
    the rank says interrupted, every emitted event on disk. SIGTERM (default action, no Python
    code runs): the rank is found crashed and recover counts what was not flushed."""
    path = tmp_path / "t"
    p = _start(path, flush_ms=60_000)
    flushed = _read_until(p, random.Random(sig).randint(2, 10))
    p.send_signal(sig)
    out, _ = p.communicate(timeout=60)
    if sig == signal.SIGINT:
        emitted = int(out.split("final")[-1])
        acc = accounting(path)
        assert acc["info"]["state"] == "interrupted"
        assert _emitted_are_on_disk(acc, emitted), (acc, emitted)
        res = run("inspect", "--strict", path)
        assert_clean_failure(res, "was interrupted", code=1)
        return
    res = run("recover", path)
    assert "Traceback" not in res.stderr
    acc = accounting(path)
    assert acc["info"]["recovered_from"] == state
    assert data_events(acc) >= flushed
    assert acc["written"] + acc["dropped"] == max(acc["max_seq"], acc["info"]["issued"])


def test_exception_exit_marks_the_rank_crashed(tmp_path):
    code = ("import sys, tracer\nfrom tracer.schema import Pool, PoolOp\n"
            "tracer.start(sys.argv[1])\n"
            "for i in range(500): tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)\n"
            "raise RuntimeError('server bug')\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and "server bug" in p.stderr
    acc = accounting(tmp_path / "t")
    assert acc["info"]["state"] == "crashed" and acc["rows"]["pool"] == 500
    assert_clean_failure(run("inspect", "--strict", tmp_path / "t"), "crashed", code=1)


def test_recover_racing_a_live_recorder_is_refused_and_changes_nothing(tmp_path):
    path = tmp_path / "t"
    p = _start(path, flush_ms=60_000)
    try:
        _read_until(p, 5)
        before = sorted(str(f) for f in path.rglob("*.arrows"))
        assert before
        res = run("recover", path)
        assert_clean_failure(res, str(path), "still being recorded", "rank=0.lock", "--force", code=2)
        assert sorted(str(f) for f in path.rglob("*.arrows")) == before
        assert not list(path.rglob("*.parquet"))
        # inspect says so too, and its hint no longer sends users to recover a live trace
        res = run("inspect", path)
        assert "state      recording" in res.stdout and "once the recorder has exited" in res.stderr
        flushed = _read_until(p, 5)
    finally:
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    emitted = int(out.split("final")[-1])
    assert emitted >= flushed
    acc = accounting(path)
    assert acc["info"]["state"] == "interrupted" and _emitted_are_on_disk(acc, emitted), (acc, emitted)
