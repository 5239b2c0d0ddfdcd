"""A report of a trace whose recorder was SIGKILLed (then recovered) says, first thing, that the
trace is incomplete and how many events were lost; a complete trace's report says nothing of
the kind. (Before, it drew the recovered part with a verdict and no word of the crash.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from replay.report import build_report
from tests.faults.util import run

_CHILD = textwrap.dedent("""
    import os, signal, sys, tracer
    from tracer.schema import Pool, PoolOp
    tracer.start(sys.argv[1], clock="manual", buffer_events=16 if sys.argv[2] == "burst" else 1024,
                 flush_interval_ms=60_000, poll_interval_ms=60_000)
    if sys.argv[2] == "kill-at-once":
        os.kill(os.getpid(), signal.SIGKILL)  # before any row reached disk
    for step in range(400):
        tracer.set_clock(1_000_000 * step)
        tracer.pool(Pool.FULL, PoolOp.ALLOC, step, 16, 1, 0)
        tracer.stats(step, int(Pool.FULL), 65536, 60000 - 16 * step, 100, 16 * step, 0)
        if step == 300:
            tracer.flush()
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # the last 99 steps are still in the buffers
    tracer.stop()
""")


def _record(path, how):
    p = subprocess.run([sys.executable, "-c", _CHILD, str(path), how], capture_output=True, text=True, timeout=120)
    assert p.returncode == (-signal.SIGKILL if how.startswith("kill") else 0), p.stderr
    return path


def test_a_report_of_a_killed_and_recovered_trace_says_it_is_incomplete(tmp_path):
    t = _record(tmp_path / "killed", "kill")
    # before recovery: one error line naming the command, not each family's open segment
    res = run("report", t, "--out", tmp_path / "r0.html")
    assert res.returncode == 2 and res.stderr.count("kvtrace: error:") == 1 and "Traceback" not in res.stderr
    assert res.stderr.count("open segment (Arrow IPC stream)") == 1 and "run `kvtrace recover TRACE`" in res.stderr
    assert "(and 1 more open segments: `kvtrace inspect" in res.stderr, res.stderr
    assert run("recover", t).returncode in (0, 1)
    rep = build_report(t, tmp_path / "r.html", diagnose=False)
    assert len(rep["incomplete"]) == 1, rep["incomplete"]
    (w,) = rep["incomplete"]
    assert w.startswith("incomplete trace killed: rank 0 was recovered after it ended crashed")
    assert "figures cover only what was recorded" in w
    page = (tmp_path / "r.html").read_text()
    assert '<p class="warn">incomplete trace killed' in page


def test_a_report_of_a_complete_trace_has_no_warning(tmp_path):
    t = _record(tmp_path / "whole", "stop")
    rep = build_report(t, tmp_path / "r.html", diagnose=False)
    assert rep["incomplete"] == [] and 'class="warn"' not in (tmp_path / "r.html").read_text()


def test_a_report_of_a_trace_with_drops_counts_them(tmp_path):
    t = _record(tmp_path / "burst", "burst")  # 16-event buffers, no flush until step 300: drops
    rep = build_report(t, tmp_path / "r.html", diagnose=False)
    (w,) = rep["incomplete"]
    assert "events lost (counted in the drops family)" in w, w


def test_a_report_of_a_recording_killed_before_its_first_rows_names_the_crash(tmp_path):
    """Not "a workload, not a recorded trace" (what it said before): the recorder ran and crashed."""
    t = _record(tmp_path / "empty", "kill-at-once")
    assert run("recover", t).returncode in (0, 1)
    res = run("report", t, "--out", tmp_path / "r.html")
    assert res.returncode == 2 and res.stderr.count("kvtrace: error:") == 1 and "Traceback" not in res.stderr
    assert "the recording holds no pool and no stats rows" in res.stderr, res.stderr
    assert "rank 0 was recovered after it ended crashed" in res.stderr and "a workload" not in res.stderr
