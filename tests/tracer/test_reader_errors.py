"""The reader refuses or reports bad traces with the file, row and expectation in the message."""

from __future__ import annotations

from tracer.schema import SCHEMA_VERSION

import json

import pyarrow as pa
import pytest

import tracer
from replay.trace import TraceError, open_trace
from tracer.schema import Pool, PoolOp
from tracer.schema.storage import write_family_table


def _trace(path, n=10):
    tracer.start(path)
    for i in range(n):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
    tracer.stop()
    return path / "pool" / "rank=0" / "part-00000.parquet"


def test_not_a_trace(tmp_path):
    with pytest.raises(TraceError, match=r"manifest.json: missing; expected a kvtrace trace directory"):
        open_trace(tmp_path)


def test_unknown_major_version_is_refused(tmp_path):
    _trace(tmp_path / "t")
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    m["schema_version"] = "2.0"
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError) as e:
        open_trace(tmp_path / "t", strict=False)
    assert str(e.value) == (f"{tmp_path}/t/manifest.json: schema_version 2.0 is not supported; "
                            f"this kvtrace reads major version 1 (schema {SCHEMA_VERSION})")


def test_minor_version_is_accepted(tmp_path):
    _trace(tmp_path / "t")
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    m["schema_version"] = "1.7"
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(m))
    assert open_trace(tmp_path / "t").rows("pool") == 10


def test_wrong_version_segment(tmp_path):
    f = _trace(tmp_path / "t")
    import pyarrow.parquet as pq

    t = pq.read_table(f)
    t = t.replace_schema_metadata({b"kvtrace.schema_version": b"3.1", b"kvtrace.family": b"pool"})
    pq.write_table(t, f)
    with pytest.raises(TraceError, match=r"part-00000.parquet: schema_version 3.1 is not supported"):
        open_trace(tmp_path / "t")


def test_truncated_segment(tmp_path):
    f = _trace(tmp_path / "t")
    f.write_bytes(f.read_bytes()[:-20])
    with pytest.raises(TraceError) as e:
        open_trace(tmp_path / "t")
    assert f"{f}: unreadable Parquet" in str(e.value)
    assert "expected a complete Parquet file" in str(e.value)
    tr = open_trace(tmp_path / "t", strict=False)
    assert [p.kind for p in tr.problems] == ["truncated"]
    assert tr.rows("pool") == 0


def test_corrupt_segment(tmp_path):
    f = _trace(tmp_path / "t")
    f.write_bytes(b"garbage" * 100)
    tr = open_trace(tmp_path / "t", strict=False)
    assert len(tr.problems) == 1 and str(tr.problems[0]).startswith(f"{f}: unreadable Parquet")


def test_missing_segment_gap(tmp_path):
    f = _trace(tmp_path / "t")
    f.rename(f.with_name("part-00002.parquet"))
    with pytest.raises(TraceError) as e:
        open_trace(tmp_path / "t")
    assert f"{f.parent}/part-00000.parquet: segment missing: expected parts 0..2 without gaps" in str(e.value)


def test_missing_column(tmp_path):
    f = _trace(tmp_path / "t")
    import pyarrow.parquet as pq

    t = pq.read_table(f).drop_columns(["num_pages"])
    pq.write_table(t, f)
    with pytest.raises(TraceError, match=r"missing columns \['num_pages'\]; expected the pool family columns"):
        open_trace(tmp_path / "t")


def _pool_table(seqs):
    n = len(seqs)
    return pa.table({"ts_ns": [0] * n, "seq": seqs, "pool": [0] * n, "op": [0] * n, "rid": [1] * n,
                     "num_slots": [1] * n, "num_pages": [1] * n, "dur_ns": [0] * n})


def test_out_of_order_and_duplicate_seq(tmp_path):
    _trace(tmp_path / "t", n=3)  # seq 1..3 in part 0
    write_family_table(tmp_path / "t", "pool", _pool_table([10, 9, 11]))  # part 1: out of order
    write_family_table(tmp_path / "t", "stats" if False else "pool", _pool_table([20, 2]))  # part 2
    probs = [str(p) for p in open_trace(tmp_path / "t").check()]
    d = f"{tmp_path}/t/pool/rank=0"
    assert f"{d}/part-00001.parquet, row 1: seq 9 follows 10: expected strictly increasing seq within a segment" in probs
    assert f"{d}/part-00002.parquet, row 1: seq 2 follows 20: expected strictly increasing seq within a segment" in probs
    assert any(p.startswith(f"{d}/part-00002.parquet, row 1: duplicate seq 2 (also in {d}/part-00000.parquet): "
                            f"expected seq unique per rank") for p in probs)


def test_bad_enum_code_is_rejected_at_write(tmp_path):
    t = _pool_table([1])
    t = t.set_column(2, "pool", pa.array([9], pa.uint8()))
    with pytest.raises(ValueError, match=r"column 'pool': code out of range 0..4"):
        write_family_table(tmp_path, "pool", t)
