"""A trace is a workload: `workload from-trace` on recorded (real sglang) and captured traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.trace import open_trace
from replay.workloads.errors import WorkloadError
from replay.workloads.extract import extract_workload
from replay.workloads.read import read_workload
from tracer.schema.manifest import new_manifest, write_manifest
from tracer.schema.storage import write_family_table

# Small sessions so that 40 requests run through the real scheduler in seconds.
SMALL_MULTI_TURN = {"system_prompt_tokens_min": "64", "system_prompt_tokens_max": "256",
                    "first_user_tokens_median": "200", "followup_user_tokens_median": "60",
                    "output_tokens_median": "24", "max_new_tokens": "64", "think_time_median_s": "0.5",
                    "mean_turns": "3"}
RECORD_SETS = ("page_size=16", "sliding_window_tokens=64", "full_pool_tokens=16384", "swa_pool_tokens=4096",
               "chunked_prefill_size=512", "max_running_requests=8")


def _stats(path) -> dict:
    res = CliRunner().invoke(main, ["workload", "stats", "--json", str(path)])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _rows(w) -> dict:
    c = w.columns
    return {"ts_ns": c.ts_ns.tolist(), "input_len": c.input_len.tolist(), "output_len": c.output_len.tolist(),
            "max_new_tokens": c.max_new_tokens.tolist(), "session_id": c.session_id.tolist(),
            "turn": c.turn.tolist(), "page_hashes": [c.hashes_of(i).tolist() for i in range(c.num_requests)]}


@pytest.mark.sglang
@pytest.mark.slow
def test_recorded_workload_extracts_back_to_itself(tmp_path):
    from replay.record import record_workload
    from replay.workloads.generate import GenerateOptions, generate_workload
    from replay.workloads.shapes import get_shape, make_config

    cfg = make_config(get_shape("multi_turn"), SMALL_MULTI_TURN)
    w_dir = generate_workload(tmp_path / "W", GenerateOptions("multi_turn", 40, qps=4.0, seed=3), cfg)
    summary = record_workload(w_dir, tmp_path / "T", overrides=RECORD_SETS)
    assert summary["hook_failures"] == {}
    assert summary["result"]["num_finished"] == 40
    res = CliRunner().invoke(main, ["workload", "from-trace", str(tmp_path / "T"), "--out", str(tmp_path / "X"),
                                    "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["assumed"] == []
    w, x = read_workload(w_dir), read_workload(tmp_path / "X")
    assert x.page_hash == w.page_hash == "kvtrace-chain-v1"
    assert open_trace(tmp_path / "T").manifest["page_hash"] == "kvtrace-chain-v1"  # the hooks name it too
    assert x.hash_block_tokens == w.hash_block_tokens
    assert len({s for s in w.columns.session_id.tolist()}) < 40  # sessions with several turns
    assert _rows(x) == _rows(w)
    assert _stats(tmp_path / "X") == _stats(w_dir)
    # the trace itself loads as that workload too (no extraction needed to replay it)
    assert _rows(read_workload(tmp_path / "T")) == _rows(w)


def _captured(d, *, hash_block_tokens=16, sessions=False):
    """A capture as the hooks write it on a server: finish rows, rid_str, turn -1, output_len -1."""
    t = pa.table({
        "ts_ns": pa.array([10, 20, 30, 40, 50, 60, 70, 80], pa.int64()),
        "seq": pa.array(range(1, 9), pa.int64()),
        "event": pa.array([0, 0, 1, 0, 1, 2, 0, 1], pa.uint8()),
        "rid": pa.array([0, 1, 0, 2, 1, 2, 3, 3], pa.int64()),
        "session_id": pa.array([5, 5, 5, -1, 5, -1, 5, 5] if sessions else [-1] * 8, pa.int64()),
        "turn": pa.array([-1] * 8, pa.int32()),
        "input_len": pa.array([32, 48, 32, 40, 48, 40, 8, 8], pa.int32()),
        "output_len": pa.array([-1, -1, 5, -1, 6, 0, -1, 7], pa.int32()),
        "max_new_tokens": pa.array([64] * 8, pa.int32()),
        "cached_len": pa.array([-1, -1, 0, -1, 32, -1, -1, 0], pa.int32()),
        "rid_str": pa.array([f"srv-{i}" for i in [0, 1, 0, 2, 1, 2, 3, 3]]),
        "page_hashes": pa.array([[1, 2], [1, 2, 3], None, [7, 8], None, None, [], None], pa.list_(pa.uint64())),
    })
    write_family_table(d, "request", t, rank=0)
    m = new_manifest(source="sglang-hooks", hash_block_tokens=hash_block_tokens, ranks=[0],
                     server={"page_size": 16})
    if hash_block_tokens is None:
        m.pop("page_hash")  # an old capture
    write_manifest(d, m)
    return d


def test_captured_trace_extracts_with_documented_defaults(tmp_path):
    _captured(tmp_path / "T", sessions=True)
    out = extract_workload(tmp_path / "T", tmp_path / "W")
    w = read_workload(out)
    c = w.columns
    assert c.input_len.tolist() == [32, 48, 40, 8]
    assert c.output_len.tolist() == [5, 6, -1, 7]  # from finish rows; the aborted one stays unknown
    assert c.session_id.tolist() == [5, 5, -1, 5]
    assert c.turn.tolist() == [0, 1, -1, 2]  # session order
    assert c.rid_str == ["srv-0", "srv-1", "srv-2", "srv-3"]
    assert w.table.column("rid").to_pylist() == [0, 1, 2, 3]
    assert [c.hashes_of(i).tolist() for i in range(4)] == [[1, 2], [1, 2, 3], [7, 8], []]
    assert w.manifest["workload"]["assumed"] == ["output_len<-finish", "turn<-session order"]
    assert w.manifest["server"] == {"page_size": 16} and w.page_hash == "kvtrace-chain-v1"
    assert _stats(out)["ideal_reused_tokens"] == 32
    # the backend view: unknown output -> max_new_tokens
    assert [r.output_len for r in w.requests] == [5, 6, 64, 7]


def test_capture_without_sessions_or_hash_block(tmp_path):
    d = tmp_path / "T"
    _captured(d, hash_block_tokens=None)
    with pytest.raises(WorkloadError, match=r"manifest.json: missing or invalid hash_block_tokens \(None\)"):
        read_workload(d)
    # without hashes too, the documented default block size applies
    t = pa.table({"ts_ns": pa.array([1], pa.int64()), "seq": pa.array([1], pa.int64()),
                  "event": pa.array([0], pa.uint8()), "rid": pa.array([0], pa.int64()),
                  "session_id": pa.array([-1], pa.int64()), "turn": pa.array([-1], pa.int32()),
                  "input_len": pa.array([9], pa.int32()), "output_len": pa.array([-1], pa.int32()),
                  "max_new_tokens": pa.array([4], pa.int32()), "cached_len": pa.array([-1], pa.int32()),
                  "rid_str": pa.array(["a"]), "page_hashes": pa.array([None], pa.list_(pa.uint64()))})
    write_family_table(tmp_path / "U", "request", t, rank=0)
    m = new_manifest(ranks=[0])
    m.pop("page_hash")
    write_manifest(tmp_path / "U", m)
    w = read_workload(tmp_path / "U")
    assert w.hash_block_tokens == 16 and w.assumed == ("hash_block_tokens=16",)
    assert w.page_hash == "kvtrace-legacy"
    assert w.columns.turn.tolist() == [-1] and w.columns.session_id.tolist() == [-1]


def _cli(*args):
    """The installed entry point in a subprocess: exit status and both streams."""
    kvtrace = os.path.join(os.path.dirname(sys.executable), "kvtrace")
    return subprocess.run([kvtrace, *args], capture_output=True, text=True)


def test_bad_inputs_exit_nonzero_without_traceback(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.txt").write_text("hi")
    _captured(tmp_path / "newer")
    m = json.loads((tmp_path / "newer" / "manifest.json").read_text())
    m["schema_version"] = "2.0"
    (tmp_path / "newer" / "manifest.json").write_text(json.dumps(m))
    (tmp_path / "noreq").mkdir()
    write_manifest(tmp_path / "noreq", new_manifest(ranks=[0]))
    _captured(tmp_path / "ok")
    cases = {
        "plain": "manifest.json: missing; expected a kvtrace trace directory",
        "newer": "manifest.json: schema_version 2.0 is not supported",
        "noreq": "no request family",
        "missing": "not a directory",
    }
    for name, message in cases.items():
        r = _cli("workload", "from-trace", str(tmp_path / name), "--out", str(tmp_path / f"out-{name}"))
        assert r.returncode != 0, name
        assert message in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
        assert not (tmp_path / f"out-{name}").exists()
    r = _cli("workload", "from-trace", str(tmp_path / "ok"), "--out", str(tmp_path / "ok"))
    assert r.returncode != 0 and "is the trace itself" in r.stderr
    assert _cli("workload", "from-trace", str(tmp_path / "ok"), "--out", str(tmp_path / "w")).returncode == 0
    r = _cli("workload", "from-trace", str(tmp_path / "ok"), "--out", str(tmp_path / "w"))
    assert r.returncode != 0 and "already exists" in r.stderr and "use --force" in r.stderr
    r = _cli("workload", "from-trace", str(tmp_path / "ok"), "--out", str(tmp_path / "w"), "--force", "--rank", "3")
    assert r.returncode != 0 and "no requests for rank 3 (ranks present: [0])" in r.stderr


def test_backend_adapter_serves_the_one_workload(tmp_path):
    from replay.backends.sglang import Workload, WorkloadRequest, load_workload, write_workload
    from replay.workloads import Workload as W1, WorkloadRequest as R1

    assert Workload is W1 and WorkloadRequest is R1
    rows = [dict(rid=7, ts_ns=5, input_len=32, page_hashes=[3, 4], output_len=-1, max_new_tokens=9),
            dict(rid=2, ts_ns=1, input_len=20, page_hashes=[3], output_len=50, max_new_tokens=9, session_id=4)]
    w = load_workload(write_workload(tmp_path / "w", rows, hash_block_tokens=16))
    assert [r.rid for r in w.requests] == [2, 7]
    assert [(r.output_len, r.max_new_tokens) for r in w.requests] == [(9, 9), (9, 9)]  # clamped / unknown
    assert w.requests[1].page_hashes.tolist() == [3, 4] and w.max_seq_tokens == 41
    bad = load_workload(write_workload(tmp_path / "b", [dict(rid=1, ts_ns=0, input_len=0, page_hashes=[])],
                                       hash_block_tokens=16))
    with pytest.raises(ValueError, match="request row 0 \\(rid 1\\) has input_len 0"):
        bad.requests
    np.testing.assert_array_equal(read_workload(tmp_path / "w").columns.rids(), [2, 7])
