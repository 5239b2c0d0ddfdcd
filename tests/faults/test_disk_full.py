"""Disk full (``RLIMIT_FSIZE`` in a subprocess: writes past the limit fail with EFBIG, as on a
full disk): the recorder reports once, the rank file says crashed, no temporary is left, record
exits 1 with a message; recover on the still-full disk fails cleanly and deletes nothing; after
recovery every event is on disk or counted and ``inspect --strict`` fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.faults.util import accounting, assert_clean_failure, data_events, file_size_limit, no_temporaries, run


_limit = file_size_limit


_CHILD = textwrap.dedent("""
    import sys, tracer
    from tracer.schema import CacheOp, Pool, PoolOp, RequestEvent
    tracer.start(sys.argv[1], flush_interval_ms=10)
    n = 0
    for k in range(60):
        for i in range(300):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 16, 1, 7 * i)
            tracer.cache(CacheOp.MATCH, i, 16)
            n += 2
        tracer.request(RequestEvent.ARRIVAL, k, input_len=100)
        n += 1
        tracer.flush()
    tracer.stop()
    print(n)
""")


def test_live_recording_on_a_full_disk_counts_every_event(tmp_path):
    path = tmp_path / "t"
    p = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True,
                       timeout=120, preexec_fn=_limit(40_000))
    assert p.returncode == 0, p.stderr  # the server is never broken by its recorder
    emitted = int(p.stdout)
    assert p.stderr.count("disabled after a write error") == 1  # reported once
    acc = accounting(path)
    assert acc["info"]["state"] == "crashed" and "File too large" in acc["info"]["error"]
    assert no_temporaries(path) == []
    # recover with the limit still in force: fails cleanly, keeps every open segment
    arrows = sorted(str(f) for f in path.rglob("*.arrows"))
    res = subprocess.run([sys.executable, "-m", "replay.cli.__init__", "recover", str(path)],
                         capture_output=True, text=True, timeout=120, preexec_fn=_limit(2_000))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "could not write its Parquet conversion" in res.stderr and "open segment was kept" in res.stderr
    assert sorted(str(f) for f in path.rglob("*.arrows")) == arrows and no_temporaries(path) == []
    # recover with room: every event emitted is on disk or counted lost
    res = run("recover", path)
    assert "Traceback" not in res.stderr
    acc = accounting(path)
    # (the recorder's own drops rows take seqs too: emitted = issued - drops rows)
    assert data_events(acc) + acc["dropped"] == emitted
    assert acc["written"] + acc["dropped"] == max(acc["max_seq"], acc["info"]["issued"])
    assert_clean_failure(run("inspect", "--strict", path), "problem(s)", code=1)


@pytest.fixture(scope="module")
def small_workload(tmp_path_factory):
    w = tmp_path_factory.mktemp("w") / "w"
    res = run("workload", "generate", "--shape", "multi_turn", "--requests", "12", "--out", w)
    assert res.returncode == 0, res.stderr
    return w


@pytest.mark.slow
@pytest.mark.sglang
def test_record_on_a_full_disk_exits_1_with_a_message(tmp_path, small_workload):
    out = tmp_path / "t"
    res = run("record", "--workload", small_workload, "--out", out, "--json", preexec_fn=_limit(30_000))
    assert_clean_failure(res, str(out), code=1)
    assert "disabled after a write error" in res.stderr and res.stderr.count("kvtrace: error:") == 1
    acc = accounting(out)
    assert acc["info"]["state"] == "crashed" and no_temporaries(out) == []
    res = run("recover", out)
    assert "Traceback" not in res.stderr
    acc = accounting(out)
    assert acc["written"] + acc["dropped"] == max(acc["max_seq"], acc["info"]["issued"])
    assert_clean_failure(run("inspect", "--strict", out), "recovered", code=1)
