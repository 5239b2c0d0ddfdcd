"""A reference run's arrival rows are written as the hooks write a declared prompt's (schema
1.1's storage form: a shared prefix is a reference to the earlier request that holds it), and
every reader sees the workload's own whole chains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replay.trace import open_trace
from replay.workloads import read_workload
from tests.reference.rows import reference_rows

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"


def test_arrival_rows_store_shared_prefixes_once_and_read_back_whole(tmp_path):
    src = WORKLOADS / "shared_prefix"
    reference_rows(src, tmp_path / "run", "swa-fixes", (), 120)
    raw = pq.read_table(sorted((tmp_path / "run" / "request").rglob("*.parquet")))
    arrivals = raw.filter(pc.equal(raw["event"].cast("string"), "arrival"))
    assert arrivals.num_rows == 120
    referenced = pc.sum(pc.greater_equal(arrivals["prefix_rid"], 0)).as_py()
    stored = pc.sum(pc.list_value_length(arrivals["page_hashes"])).as_py()
    wl = {w.rid: w for w in read_workload(src).requests[:120]}
    total = sum(len(w.page_hashes) for w in wl.values())
    assert referenced > 60 and stored < total / 2, (referenced, stored, total)  # one system prompt each
    t = open_trace(tmp_path / "run").table("request")
    rows = t.filter(pc.equal(t["event"].cast("string"), "arrival")).to_pylist()
    assert len(rows) == 120
    for r in rows:
        assert r["prefix_rid"] == -1 and r["prefix_blocks"] == 0
        assert np.array_equal(np.asarray(r["page_hashes"], np.uint64), np.asarray(wl[r["rid"]].page_hashes, np.uint64))


def test_a_bad_prefix_slots_setting_falls_back_with_one_warning(monkeypatch, caplog):
    """``KVTRACE_PREFIX_SLOTS`` of any value builds an index: not an integer or negative gives the
    default, a huge one the cap, each said once in the log; 0 turns referencing off."""
    import logging

    from tracer.schema import prefixes as px

    monkeypatch.setattr(px, "_warned", set())
    cases = {"abc": px.DEFAULT_SLOTS, "-5": px.DEFAULT_SLOTS, "1.5": px.DEFAULT_SLOTS, "": px.DEFAULT_SLOTS,
             str(10**12): px.MAX_SLOTS, "0": 0, "1000": 1024}
    with caplog.at_level(logging.WARNING, logger="kvtrace"):
        for raw, want in cases.items():
            monkeypatch.setenv("KVTRACE_PREFIX_SLOTS", raw)
            assert px.new_prefix_index().num_slots == want, raw
        px.new_prefix_index()  # the same bad value again: no second line
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all("KVTRACE_PREFIX_SLOTS" in m for m in lines), lines
