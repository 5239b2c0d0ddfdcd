"""A recording process SIGKILLed mid-stream: recover + open_trace keep every flushed event."""

from __future__ import annotations

import json
from pathlib import Path
import signal
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from replay.cli import main as cli
from replay.trace import TraceError, open_trace

_CHILD = textwrap.dedent("""
    import sys, tracer
    from tracer.schema import Pool, PoolOp
    tracer.start(sys.argv[1], flush_interval_ms=60_000, poll_interval_ms=60_000)
    i = 0
    while True:
        for _ in range(997):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, i % 1000, 1, 7 * i)
            i += 1
        tracer.flush()                       # everything below i is on disk now
        print(i, flush=True)
""")


def test_sigkill_loses_only_unflushed_events(tmp_path):
    path = tmp_path / "t"
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    flushed = 0
    for line in p.stdout:
        flushed = int(line)
        if flushed >= 40 * 997:
            break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL

    try:
        open_trace(path)
    except TraceError as e:
        assert "open segment" in str(e) and "kvtrace recover" in str(e)
    else:
        raise AssertionError("an unrecovered trace must be refused in strict mode")

    res = CliRunner().invoke(cli, ["recover", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["segments_recovered"] >= 1
    tr = open_trace(path)
    rows = tr.table("pool")
    rids = rows.column("rid").to_pylist()
    assert out["rows_recovered"] == len(rids) >= flushed
    assert rids == list(range(len(rids)))  # contiguous prefix, nothing corrupt or reordered
    assert rows.column("num_slots").to_pylist() == [i % 1000 for i in rids]
    assert rows.column("dur_ns").to_pylist() == [7 * i for i in rids]
    # nothing uncounted; the only problem left is the honest end state
    assert [(p.kind, "recovered after it ended crashed" in p.message) for p in tr.check()] == [("state", True)]


def test_truncated_stream_recovers_complete_batches(tmp_path):
    import tracer
    from tracer.schema import Pool, PoolOp

    tracer.start(tmp_path / "t", flush_interval_ms=60_000, poll_interval_ms=60_000,
                 segment_max_bytes=1 << 30)
    rec = tracer.active()
    for k in range(5):
        for i in range(100):
            tracer.pool(Pool.SWA, PoolOp.FREE, k * 100 + i, 1)
        tracer.flush()
    seg = rec.segments["pool"]
    data = seg.path.read_bytes()
    rec.abandon_in_child()  # simulate the crash: nothing more written, nothing closed
    tracer._active = None
    tracer._bind(None)
    seg.path.write_bytes(data[:-10])  # tear the last batch
    res = CliRunner().invoke(cli, ["recover", str(tmp_path / "t"), "--json"])
    out = json.loads(res.stdout)
    assert out["rows_recovered"] == 400
    assert len(out["torn"]) == 1 and "torn after 4 batches" in out["torn"][0]
    # the torn batch is counted (the rank file noted seq 500 flushed) and its bytes kept aside
    assert res.exit_code == 1 and out["lost_events"] == {"0": 100}
    assert out["moved_aside"] == [str(seg.path) + ".unreadable"] and Path(out["moved_aside"][0]).is_file()
    assert "kvtrace: error:" in res.stderr and "100 events could not be recovered" in res.stderr
    tr = open_trace(tmp_path / "t")
    assert tr.rows("pool") == 400 and tr.num_dropped == 100
    assert {p.kind for p in tr.check()} == {"state", "drops"}


def test_interpreter_exit_flushes_and_closes(tmp_path):
    code = textwrap.dedent("""
        import sys, tracer
        from tracer.schema import Pool, PoolOp
        tracer.start(sys.argv[1], flush_interval_ms=60_000)
        for i in range(1234):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        # no tracer.stop(): atexit must flush and convert the open segment
    """)
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "t")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert not list((tmp_path / "t").rglob("*.arrows"))
    tr = open_trace(tmp_path / "t")
    assert tr.rows("pool") == 1234
    assert '"state": "complete"' in (tmp_path / "t" / "ranks" / "rank=0.json").read_text()
