"""Any trace is a workload: only request arrivals are used; bad inputs are refused clearly."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from replay.workloads.errors import WorkloadError
from replay.workloads.io import RequestColumns, read_workload, workload_manifest, write_workload
from replay.workloads.stats import workload_stats
from tracer.schema.manifest import write_manifest
from tracer.schema.storage import write_family_table


def _full_trace(d, rank=0, base=0):
    """A recorder-like trace: arrival and finish rows (uint8 event codes), plus another family."""
    n = 4
    t = pa.table({
        "ts_ns": pa.array([10, 20, 30, 40, 50, 60, 70, 80], pa.int64()),
        "seq": pa.array(range(1, 9), pa.int64()),
        "event": pa.array([0, 0, 1, 0, 1, 2, 0, 1], pa.uint8()),
        "rid": pa.array([0, 1, 0, 2, 1, 2, 3, 3], pa.int64()),
        "session_id": pa.array([-1] * 8, pa.int64()),
        "turn": pa.array([-1] * 8, pa.int32()),
        "input_len": pa.array([32, 16, 32, 40, 16, 40, 8, 8], pa.int32()),
        "output_len": pa.array([-1, -1, 5, -1, 6, 0, -1, 7], pa.int32()),
        "max_new_tokens": pa.array([64] * 8, pa.int32()),
        "cached_len": pa.array([-1, -1, 0, -1, 16, -1, -1, 0], pa.int32()),
        "rid_str": pa.array([f"r{base + i}" for i in [0, 1, 0, 2, 1, 2, 3, 3]]),
        "page_hashes": pa.array([[1, 2], [1], None, [1, 2], None, None, [], None], pa.list_(pa.uint64())),
    })
    write_family_table(d, "request", t, rank=rank)
    m = workload_manifest(16, {})
    m.update(producer={"name": "kvtrace", "version": "x", "source": "tracer"}, ranks=[0, 1])
    m.pop("workload")  # a recorder's manifest has no workload key
    write_manifest(d, m)
    assert n == 4


def test_full_trace_arrivals_only(tmp_path):
    _full_trace(tmp_path)
    w = read_workload(tmp_path)
    assert w.num_requests == 4
    assert w.table.column("rid").to_pylist() == [0, 1, 2, 3]
    assert w.columns.input_len.tolist() == [32, 16, 40, 8]
    s = workload_stats(w)
    assert s["ideal_reused_tokens"] == 16 * 3  # [1] reuses block 1; [1, 2] reuses both


def test_rank_selection(tmp_path):
    _full_trace(tmp_path, rank=0)
    _full_trace(tmp_path, rank=1, base=100)
    assert read_workload(tmp_path).columns.rid_str[0] == "r0"
    assert read_workload(tmp_path, rank=1).columns.rid_str[0] == "r100"
    with pytest.raises(WorkloadError, match=r"no requests for rank 5 \(ranks present: \[0, 1\]\)"):
        read_workload(tmp_path, rank=5)


def test_unknown_major_version_is_refused(tmp_path):
    cols = RequestColumns(np.array([0]), np.array([-1]), np.array([-1]), np.array([16]), np.array([1]),
                          np.array([1]), np.array([7], np.uint64), np.array([0, 1]))
    write_workload(tmp_path / "W", cols, 16, {})
    m = json.loads((tmp_path / "W" / "manifest.json").read_text())
    m["schema_version"] = "2.0"
    (tmp_path / "W" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(WorkloadError, match=r"manifest.json: schema_version 2.0 is not supported"):
        read_workload(tmp_path / "W")


def test_not_a_trace(tmp_path):
    with pytest.raises(WorkloadError, match="not a directory"):
        read_workload(tmp_path / "missing")
    with pytest.raises(WorkloadError, match="manifest.json: missing; expected a kvtrace trace directory"):
        read_workload(tmp_path)


def test_segments_are_checked_by_the_one_trace_reader(tmp_path):
    """Request segments are found and checked by replay.trace; other families' problems don't matter."""
    _full_trace(tmp_path)
    (tmp_path / "cache" / "rank=0").mkdir(parents=True)
    (tmp_path / "cache" / "rank=0" / "part-00000.parquet").write_bytes(b"not parquet")
    assert read_workload(tmp_path).num_requests == 4
    (tmp_path / "request" / "rank=0" / "part-00001.arrows").write_bytes(b"")
    with pytest.raises(WorkloadError, match=r"part-00001.arrows: open segment .* run `kvtrace recover TRACE`"):
        read_workload(tmp_path)


def test_readers_do_not_scan_segments_themselves():
    """Only replay/trace.py lists segment files or checks schema versions."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "replay"
    for p in list((root / "workloads").rglob("*.py")) + [root / "backends" / "sglang" / "workload.py"]:
        text = p.read_text()
        for needle in ("glob(\"part-", "glob(\"rank=", "parse_major", "SCHEMA_MAJOR", "pq.read_table",
                       "ParquetFile", "pyarrow.dataset"):
            assert needle not in text, f"{p} uses {needle}: read through replay.trace instead"


@pytest.mark.parametrize("order", ["sorted", "shuffled", "ties"])
def test_arrivals_come_in_time_then_seq_order_however_stored(tmp_path, order):
    """A workload already in (ts_ns, seq) order is taken as stored (no copy of its hashes);
    any other order, ties on ts_ns included, is sorted as before."""
    ts = {"sorted": [10, 20, 30, 40], "shuffled": [30, 10, 40, 20], "ties": [20, 20, 10, 20]}[order]
    seq = {"sorted": [1, 2, 3, 4], "shuffled": [1, 2, 3, 4], "ties": [4, 2, 3, 1]}[order]
    t = pa.table({
        "ts_ns": pa.array(ts, pa.int64()), "seq": pa.array(seq, pa.int64()),
        "event": pa.array([0] * 4, pa.uint8()), "rid": pa.array([0, 1, 2, 3], pa.int64()),
        "session_id": pa.array([-1] * 4, pa.int64()), "turn": pa.array([-1] * 4, pa.int32()),
        "input_len": pa.array([8, 16, 24, 32], pa.int32()), "output_len": pa.array([1] * 4, pa.int32()),
        "max_new_tokens": pa.array([4] * 4, pa.int32()), "cached_len": pa.array([-1] * 4, pa.int32()),
        "rid_str": pa.array(["a", "b", "c", "d"]),
        "page_hashes": pa.array([[1], [1, 2], [3], [4, 5]], pa.list_(pa.uint64())),
    })
    write_family_table(tmp_path, "request", t, rank=0)
    write_manifest(tmp_path, workload_manifest(16, {}))
    w = read_workload(tmp_path)
    want = sorted(range(4), key=lambda i: (ts[i], seq[i]))
    assert w.table.column("rid").to_pylist() == want
    assert w.columns.ts_ns.tolist() == sorted(ts)
    hashes = [[1], [1, 2], [3], [4, 5]]
    got = [w.columns.page_hashes[w.columns.hash_offsets[i]:w.columns.hash_offsets[i + 1]].tolist() for i in range(4)]
    assert got == [hashes[i] for i in want]
