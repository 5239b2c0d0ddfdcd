"""Round trip of every family through the recorder, the segments and the reader."""

from __future__ import annotations

import pyarrow as pa

import tracer
from replay.trace import open_trace
from tracer.schema import (
    FAMILIES,
    CacheOp,
    DropReason,
    Mode,
    Pool,
    PoolOp,
    RequestEvent,
    SchedKind,
    Verdict,
)


def _record(path, n=50, **opts):
    rec = tracer.start(path, server={"page_size": 16, "sliding_window_tokens": 128}, hash_block_tokens=16,
                       **opts)
    for i in range(n):
        tracer.tick()
        tracer.request(RequestEvent.ARRIVAL, i, 7, 1, 100 + i, 20, 64, -1, f"r{i}", [i, i + 1])
        tracer.sched(SchedKind.ADMIT, i, Mode.PREFILL, 1, 100, 5000, i, 32, 68, 0, 68, 64,
                     Verdict.CHUNKED, 1000 - i, 500 - i, 200)
        tracer.pool(Pool.SWA, PoolOp.ALLOC, i, 64, 4, 123)
        tracer.pool_ids(Pool.FULL, PoolOp.FREE, i, 32, 2, 0, [i, i + 1])
        tracer.cache(CacheOp.EVICT, -1, 0, 0, 0, 16, 32, 0, 2, 1, 999)
        tracer.stats(i, Pool.HOST_FULL, 4096, 1000, 2000, 96, 1000)
        rec.check_integrity()
    tracer.stop()
    rec.check_integrity()


def test_every_family_round_trips(tmp_path):
    _record(tmp_path / "t", detail="pages")
    tr = open_trace(tmp_path / "t")
    assert tr.manifest["server"]["page_size"] == 16
    assert tr.manifest["hash_block_tokens"] == 16
    assert {f: tr.rows(f) for f in FAMILIES} == {
        "request": 50, "sched": 50, "cache": 50, "pool": 100, "stats": 50, "drops": 0}
    req = tr.table("request").to_pylist()[3]
    assert {k: req[k] for k in ("event", "rid", "session_id", "turn", "input_len", "rid_str",
                                 "page_hashes", "rank")} == {
        "event": "arrival", "rid": 3, "session_id": 7, "turn": 1, "input_len": 103,
        "rid_str": "r3", "page_hashes": [3, 4], "rank": 0}
    sched = tr.table("sched").to_pylist()[5]
    assert (sched["kind"], sched["mode"], sched["verdict"], sched["chunk_admitted"], sched["rem_swa"]) == (
        "admit", "prefill", "chunked", 64, 495)
    pool = tr.table("pool").to_pylist()
    assert (pool[0]["pool"], pool[0]["op"], pool[0]["num_slots"], pool[0]["dur_ns"], pool[0]["page_ids"]) == (
        "swa", "alloc", 64, 123, None)
    assert (pool[1]["pool"], pool[1]["op"], pool[1]["page_ids"]) == ("full", "free", [0, 1])
    cache = tr.table("cache").to_pylist()[0]
    assert (cache["op"], cache["swa_tokens"], cache["tombstones"], cache["dur_ns"]) == ("evict", 32, 1, 999)
    stats = tr.table("stats").to_pylist()[9]
    assert (stats["pool"], stats["capacity"], stats["held"], stats["forward_ct"]) == ("host_full", 4096, 1000, 9)
    assert tr.check() == []


def test_seq_is_a_total_order_and_events_merge(tmp_path):
    _record(tmp_path / "t", n=20)
    tr = open_trace(tmp_path / "t")
    evs = list(tr.events(rank=0))
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert [e.family for e in evs[:6]] == ["request", "sched", "pool", "pool", "cache", "stats"]
    ts = [e.ts_ns for e in evs]
    assert ts == sorted(ts)


def test_duckdb_and_polars_views_agree(tmp_path):
    _record(tmp_path / "t", n=30)
    tr = open_trace(tmp_path / "t")
    n_duck = tr.relation("pool").filter("pool = 'swa'").aggregate("sum(num_slots)").fetchall()[0][0]
    import polars as pl

    n_pl = tr.lazy("pool").filter(pl.col("pool") == "swa").select(pl.col("num_slots").sum()).collect().item()
    assert n_duck == n_pl == 30 * 64
    assert tr.relation("drops").aggregate("count(*)").fetchall()[0][0] == 0
    assert tr.lazy("pool").select("rank").unique().collect().to_series().to_list() == [0]


def test_disabled_emits_are_noops_and_record_nothing(tmp_path):
    assert not tracer.is_active()
    assert tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1) is None
    assert tracer.tick() == 0
    tracer.start(tmp_path / "t")
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    tracer.stop()
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 2, 1)  # after stop: ignored
    assert open_trace(tmp_path / "t").rows("pool") == 1


def test_segments_rotate_by_size(tmp_path):
    tracer.start(tmp_path / "t", segment_max_bytes=4096, flush_interval_ms=10)
    for i in range(2000):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        if i % 200 == 0:
            tracer.flush()
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    parts = tr.files("pool")
    assert len(parts) > 1
    assert tr.rows("pool") == 2000
    assert tr.table("pool").column("rid").to_pylist() == list(range(2000))


def test_storage_encodes_enum_strings(tmp_path):
    from tracer.schema.storage import write_family_table

    t = pa.table({"ts_ns": [1], "seq": [1], "family": ["pool"], "first_seq": [3], "last_seq": [9],
                  "num_events": [7], "reason": ["buffer_full"], "detail": [""]})
    write_family_table(tmp_path, "drops", t)
    from tracer.schema.manifest import new_manifest, write_manifest

    write_manifest(tmp_path, new_manifest())
    tr = open_trace(tmp_path)
    assert tr.table("drops").column("reason").to_pylist() == ["buffer_full"]
    assert int(DropReason.BUFFER_FULL) == 0
    assert f"{tmp_path}/drops/rank=0/part-00000.parquet, row 0: 7 pool lost (buffer_full), seq 3..9" in [
        str(p) for p in tr.check()]


def test_manual_clock_is_deterministic(tmp_path):
    tracer.start(tmp_path / "t", clock="manual")
    for i in range(5):
        tracer.set_clock(1000 * i)
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
        tracer.sched(SchedKind.STEP, i, Mode.DECODE, 1, 1, 0)
    assert tracer.tick() == 4000
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    assert tr.table("pool").column("ts_ns").to_pylist() == [0, 1000, 2000, 3000, 4000]
    assert tr.table("sched").column("ts_ns").to_pylist() == [0, 1000, 2000, 3000, 4000]


def test_a_repeated_manual_clock_leaves_one_mark(tmp_path):
    # a replay sets the clock at a step's end and to the same value at the next step's begin:
    # one mark, the same row stamps; a later change still stamps the rows after it
    rec = tracer.start(tmp_path / "t", clock="manual", flush_interval_ms=60_000, poll_interval_ms=60_000)
    for t in (1000, 1000, 1000, 2000, 2000, 1000):
        tracer.set_clock(t)
        tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    assert [t for _s, t in rec.marks] == [1000, 2000, 1000]
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    assert tr.table("pool").column("ts_ns").to_pylist() == [1000, 1000, 1000, 2000, 2000, 1000]


def test_set_clock_needs_manual_mode(tmp_path):
    import pytest

    assert tracer.set_clock(5) == 0  # off: a no-op
    tracer.start(tmp_path / "t")
    with pytest.raises(RuntimeError, match="clock='manual'"):
        tracer.set_clock(5)


def test_step_clock_marks_give_pool_and_cache_rows_their_step_time(tmp_path):
    tracer.start(tmp_path / "t", flush_interval_ms=60_000, poll_interval_ms=60_000)
    t1 = tracer.tick()
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    tracer.flush()  # the mark of t1 must carry over to rows of the next flush
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 2, 1)
    tracer.sched(SchedKind.STEP, 1, Mode.DECODE, 1, 1, 0)  # reads the clock: a new mark
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 3, 1)
    t3 = tracer.tick()
    tracer.cache(CacheOp.MATCH, 3, 16)
    tracer.stop()
    tr = open_trace(tmp_path / "t")
    t2 = tr.table("sched").column("ts_ns").to_pylist()[0]
    assert t1 < t2 < t3
    assert tr.table("pool").column("ts_ns").to_pylist() == [t1, t1, t2]
    assert tr.table("cache").column("ts_ns").to_pylist() == [t3]


def test_event_clock_keeps_ts_in_every_record(tmp_path):
    tracer.start(tmp_path / "t", clock="event")
    for i in range(3):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 1)
    tracer.stop()
    ts = open_trace(tmp_path / "t").table("pool").column("ts_ns").to_pylist()
    assert ts == sorted(ts) and len(set(ts)) == 3


def test_marks_survive_flushes_that_write_nothing(tmp_path):
    rec = tracer.start(tmp_path / "t", flush_interval_ms=60_000, poll_interval_ms=60_000)
    t1 = tracer.tick()
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    t2 = tracer.tick()
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 2, 1)
    rec.flush(force=False)  # nothing half full: nothing written, no mark may be lost
    tracer.stop()
    assert open_trace(tmp_path / "t").table("pool").column("ts_ns").to_pylist() == [t1, t2]
