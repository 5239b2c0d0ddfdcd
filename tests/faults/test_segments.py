"""Truncated, duplicated, zeroed, emptied, random and foreign segments, open (``.arrows``) and
closed (``.parquet``): recover keeps what is readable, moves the rest aside and counts it;
``inspect --strict`` names the file and what was expected."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import tracer
from replay.cli import main as cli
from replay.trace import open_trace
from tests.faults.util import accounting, data_events
from tracer.schema import CacheOp, Pool, PoolOp

ROUNDS, PER_ROUND = 6, 50


def _crashed_trace(path: Path) -> tuple[Path, int]:
    """A recording whose process 'died' with its segments open: each of ROUNDS flushes is one
    record batch per family. Returns (the pool segment, events emitted)."""
    tracer.start(path, flush_interval_ms=60_000, poll_interval_ms=60_000, segment_max_bytes=1 << 30)
    rec = tracer.active()
    n = 0
    for k in range(ROUNDS):
        for i in range(PER_ROUND):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
            tracer.cache(CacheOp.MATCH, i, 1)
            n += 2
        tracer.flush()
    seg = rec.segments["pool"].path
    rec.abandon_in_child()  # the crash: nothing more written, nothing closed
    tracer._active = None
    tracer._bind(None)
    return seg, n


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _mangle(seg: Path, how: str) -> None:
    data = seg.read_bytes()
    if how == "truncated":
        seg.write_bytes(data[: len(data) - 37])
    elif how == "zeroed":
        seg.write_bytes(b"\0" * len(data))
    elif how == "empty":
        seg.write_bytes(b"")
    elif how == "random":
        seg.write_bytes(os.urandom(len(data)))
    elif how == "foreign":  # a stream of another family's schema in the pool folder
        sink = pa.BufferOutputStream()
        t = pa.table({"x": list(range(10))})
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        seg.write_bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("how", ["truncated", "zeroed", "empty", "random", "foreign"])
def test_broken_open_segment_is_kept_aside_and_counted(tmp_path, how):
    path = tmp_path / "t"
    seg, emitted = _crashed_trace(path)
    _mangle(seg, how)
    res = _invoke("recover", "--json", path)
    assert res.exception is None or isinstance(res.exception, SystemExit)
    out = json.loads(res.stdout)
    assert res.exit_code == 1, res.output  # something was lost: never exit 0
    assert "kvtrace: error:" in res.stderr and "could not be recovered" in res.stderr
    aside = Path(str(seg) + ".unreadable")
    assert out["moved_aside"] == [str(aside)] and aside.is_file()  # the bytes are kept
    assert not seg.exists() and not list(path.rglob("*.arrows"))
    acc = accounting(path)
    # the cache family is intact; what the pool stream lost is counted, nothing silently
    assert acc["rows"]["cache"] == emitted // 2
    assert data_events(acc) + acc["dropped"] == emitted
    probs = [str(p) for p in open_trace(path).check()]
    assert any("lost (torn)" in p for p in probs) and any("recovered" in p for p in probs)
    assert not any("neither on disk nor counted" in p for p in probs)
    res = _invoke("inspect", "--strict", path)
    assert res.exit_code == 1 and "unreadable" in res.stdout


def test_recover_refuses_an_unknown_family_folder_and_touches_nothing(tmp_path):
    path = tmp_path / "t"
    seg, _ = _crashed_trace(path)
    odd = path / "weird" / "rank=0"
    odd.mkdir(parents=True)
    shutil.copy(seg, odd / "part-00000.arrows")
    before = sorted(p.name for p in path.rglob("*"))
    res = _invoke("recover", path)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{path / 'weird'}: open segments under a folder that is not a trace family" in res.stderr
    assert sorted(p.name for p in path.rglob("*")) == before


def _complete_trace(path: Path) -> int:
    tracer.start(path, flush_interval_ms=60_000, poll_interval_ms=60_000)
    for k in range(3):
        for i in range(40):
            tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        tracer.flush()
    tracer.stop()
    return 120


def _parts(path: Path, fam="pool"):
    return sorted((path / fam / "rank=0").glob("part-*.parquet"))


def test_complete_trace_passes_strict(tmp_path):
    _complete_trace(tmp_path / "t")
    res = _invoke("inspect", "--strict", "--json", tmp_path / "t")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["state"] == "complete"


def test_duplicated_segment_fails_strict(tmp_path):
    path = tmp_path / "t"
    _complete_trace(path)
    p = _parts(path)[0]
    shutil.copy(p, p.with_name(f"part-{len(_parts(path)):05d}.parquet"))
    probs = [str(q) for q in open_trace(path, strict=False).check()]
    assert any("duplicate seq" in q and "expected seq unique per rank" in q for q in probs)
    assert any("recorded 120 pool events; expected equal" in q for q in probs)
    res = _invoke("inspect", "--strict", path)
    assert res.exit_code == 1 and "duplicate seq" in res.stderr


def test_segment_with_half_its_rows_fails_strict(tmp_path):
    path = tmp_path / "t"
    _complete_trace(path)
    p = _parts(path)[0]
    t = pq.read_table(p)
    pq.write_table(t.slice(0, t.num_rows // 2), p)  # keeps the schema's kvtrace metadata
    probs = [str(q) for q in open_trace(path, strict=False).check()]
    assert any("60 rows on disk but" in q and "recorded 120 pool events" in q for q in probs), probs
    assert any("60 events issued (seq up to 120) are neither on disk nor counted in drops" in q for q in probs)


def test_rank_folder_missing_from_manifest_fails_strict(tmp_path):
    path = tmp_path / "t"
    _complete_trace(path)
    shutil.copytree(path / "pool" / "rank=0", path / "pool" / "rank=3")
    probs = [str(q) for q in open_trace(path, strict=False).check()]
    assert any("rank 3 has data but" in q and "lists ranks [0]" in q for q in probs), probs


def test_manifest_not_an_object_and_rank_file_not_an_object(tmp_path):
    path = tmp_path / "t"
    _complete_trace(path)
    (path / "ranks" / "rank=0.json").write_text("[1, 2]")
    res = _invoke("inspect", "--strict", path)
    assert res.exit_code == 1 and "rank=0.json" in res.output and "expected an object" in res.output
    (path / "manifest.json").write_text("[1, 2]")
    for cmd in ("inspect", "recover"):
        res = _invoke(cmd, path)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert "manifest.json" in res.stderr and "expected" in res.stderr and "object" in res.stderr


def test_recover_removes_a_dead_recorders_half_written_rank_file(tmp_path):
    # a SIGKILL between writing the rank file's temporary and renaming it leaves the temporary
    import subprocess
    import sys

    path = tmp_path / "t"
    _crashed_trace(path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = path / "ranks" / f".rank=0.json.{dead.pid}.tmp"
    stale.write_text('{"state": "rec')
    alive = path / "ranks" / f".rank=0.json.{os.getppid()}.tmp"  # a writer still running: kept
    alive.write_text('{"state": "rec')
    res = _invoke("recover", "--json", path)
    out = json.loads(res.output)
    assert out["stale_temporaries"] == [str(stale)]
    assert not stale.exists() and alive.exists()
    assert json.loads((path / "ranks" / "rank=0.json").read_text())["state"] == "recovered"
    alive.unlink()
    res = _invoke("recover", path)  # nothing left to remove: the line is not printed
    assert "half-written" not in res.output
