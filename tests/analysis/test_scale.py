"""The scalable paths of occupancy and churn give the same rows as the ordered window.

``occupancy`` computes ``used_events_max`` in one streaming pass in file order when the pool
segments are in seq order (``events_in_seq_order``), else with a window ordered by seq over all
events. Both paths, in both engines, are checked against each other and against a plain numpy
running sum, on random multi-segment traces (several files, several row groups each, all the
pool ops, every pool, negative running sums of a warm capture).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from replay.analysis import churn, occupancy
from replay.analysis.occupancy import events_in_seq_order
from tracer.schema import FAMILIES, SCHEMA_VERSION, enum_names
from tracer.schema.storage import to_stored, write_parquet

POOLS = enum_names(FAMILIES["pool"].columns[2].enum)
OPS = enum_names(FAMILIES["pool"].columns[3].enum)
KV = ("full", "swa", "host_full", "host_swa")


def random_trace(path: Path, seed: int, events: int = 3000, segments: int = 3, ranks=(0,),
                 overlap: bool = False, row_group_rows: int = 256) -> Path:
    """``events`` pool rows per rank over ``segments`` files (seq strictly increasing file after
    file, or with ``overlap`` the last rows of a file after the first of the next), ts jittered
    so that it is not monotone in seq, plus a few stats rows."""
    rng = np.random.default_rng(seed)
    for rank in ranks:
        seq = np.cumsum(rng.integers(1, 4, events)).astype(np.int64)
        ts = np.sort(rng.integers(0, 5_000_000_000, events)).astype(np.int64)
        ts = np.maximum(ts + rng.integers(-50_000_000, 50_000_000, events), 0)  # not monotone in seq
        pool = rng.choice(len(POOLS), events, p=[0.35, 0.3, 0.15, 0.15, 0.05]).astype(np.uint8)
        op = rng.choice(len(OPS), events, p=[0.45, 0.4, 0.03, 0.03, 0.03, 0.03, 0.03]).astype(np.uint8)
        slots = rng.integers(0, 64, events).astype(np.int32)
        cuts = np.linspace(0, events, segments + 1).astype(int)
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            idx = np.arange(a, b)
            if overlap and i + 1 < segments:  # swap the boundary rows into each other's file
                idx = np.r_[idx[:-1], b]
            if overlap and i > 0:
                idx = np.r_[a - 1, idx[1:]]
            tbl = pa.table({"ts_ns": ts[idx], "seq": seq[idx], "pool": pool[idx], "op": op[idx],
                            "rid": np.full(len(idx), -1, np.int64), "num_slots": slots[idx],
                            "num_pages": slots[idx] // 16, "dur_ns": np.zeros(len(idx), np.int64)})
            tbl = tbl.sort_by("seq")
            d = path / "pool" / f"rank={rank}"
            d.mkdir(parents=True, exist_ok=True)
            write_parquet(d / f"part-{i:05d}.parquet", to_stored(tbl, FAMILIES["pool"]),
                          row_group_rows=row_group_rows)
        k = np.arange(0, events, 97)
        stats = pa.table({"ts_ns": ts[k], "seq": seq[k] * 0 + np.arange(len(k)) + seq[-1] + 1,
                          "forward_ct": np.arange(len(k), dtype=np.int64),
                          "pool": pool[k] % 4, "capacity": np.full(len(k), 4096),
                          "available": rng.integers(0, 4096, len(k)), "evictable": np.ones(len(k), np.int64),
                          "protected": np.zeros(len(k), np.int64), "held": np.zeros(len(k), np.int64)})
        d = path / "stats" / f"rank={rank}"
        d.mkdir(parents=True, exist_ok=True)
        write_parquet(d / "part-00000.parquet", to_stored(stats, FAMILIES["stats"]))
    (path / "manifest.json").write_text(json.dumps({
        "schema_version": SCHEMA_VERSION, "producer": {"name": "kvtrace", "source": "test"},
        "hash_block_tokens": 16, "ranks": list(ranks), "server": {"page_size": 16}}))
    return path


def numpy_used_events_max(path: Path, res: int, pools=KV) -> pl.DataFrame:
    """The definition, computed the plain way: all pool rows in seq order, running sum of
    alloc - free per pool, max per (pool, bucket)."""
    df = pl.concat([pl.read_parquet(f).with_columns(pl.col("pool", "op").cast(pl.String))
                    for f in sorted(path.glob("pool/rank=*/*.parquet"))]).sort("seq")
    df = df.filter(pl.col("op").is_in(["alloc", "free"]) & pl.col("pool").is_in(list(pools)))
    out = []
    for p in pools:
        part = df.filter(pl.col("pool") == p)
        if part.height == 0:
            continue
        n = part["num_slots"].to_numpy().astype(np.int64)
        run = np.cumsum(np.where(part["op"].to_numpy() == "alloc", n, -n))
        out.append(pl.DataFrame({"pool": p, "t_ns": part["ts_ns"].to_numpy() // res * res, "u": run})
                   .group_by("pool", "t_ns").agg(used_events_max=pl.col("u").max()))
    if not out:
        return pl.DataFrame(schema={"pool": pl.String, "t_ns": pl.Int64, "used_events_max": pl.Int64})
    return pl.concat(out).sort("pool", "t_ns")


def _all_paths(path, resample):
    return {(engine, streaming): (occupancy(path, resample=resample, engine=engine, streaming=streaming)
                                  .collect() if engine == "polars" else
                                  occupancy(path, resample=resample, engine=engine, streaming=streaming).pl())
            for engine in ("polars", "duckdb") for streaming in (True, False)}


@pytest.mark.parametrize("resample", ["1s", "10ms", 7_777_777])
def test_streaming_and_sorted_paths_agree_with_numpy(tmp_path, resample):
    path = random_trace(tmp_path / "t", seed=3, events=5000, segments=4)
    assert events_in_seq_order(path)
    frames = _all_paths(path, resample)
    base = frames[("polars", False)]
    for key, df in frames.items():
        assert_frame_equal(df, base)  # ints exact; t_s to float tolerance
    res = {"1s": 10**9, "10ms": 10**7}.get(resample, resample)
    want = numpy_used_events_max(path, res)
    got = base.filter(pl.col("used_events_max").is_not_null()).select("pool", "t_ns", "used_events_max")
    assert_frame_equal(got, want)
    assert (want["used_events_max"] < 0).any()  # a warm capture's negative running sums are kept


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), events=st.integers(1, 400), segments=st.integers(1, 5),
       rg=st.sampled_from([7, 64, 1 << 20]))
def test_streaming_path_property(tmp_path_factory, seed, events, segments, rg):
    path = random_trace(tmp_path_factory.mktemp("p"), seed, events=events,
                        segments=min(segments, events), row_group_rows=rg)
    want = numpy_used_events_max(path, 10**8)
    for engine in ("polars", "duckdb"):
        q = occupancy(path, resample="100ms", engine=engine, streaming=True)
        df = q.collect() if engine == "polars" else q.pl()
        got = df.filter(pl.col("used_events_max").is_not_null()).select("pool", "t_ns", "used_events_max")
        assert_frame_equal(got, want)


@pytest.mark.parametrize("kind", ["overlap", "ranks"])
def test_unordered_files_fall_back_to_the_sorted_window(tmp_path, kind):
    path = random_trace(tmp_path / "t", seed=5, events=2000, segments=3,
                        overlap=kind == "overlap", ranks=(0, 1) if kind == "ranks" else (0,))
    assert not events_in_seq_order(path)
    with pytest.raises(ValueError, match="not in seq order"):
        occupancy(path, streaming=True)
    auto_pl = occupancy(path, resample="1s").collect()
    auto_db = occupancy(path, resample="1s", engine="duckdb").pl()
    sorted_pl = occupancy(path, resample="1s", streaming=False).collect()
    assert_frame_equal(auto_pl, sorted_pl)
    assert_frame_equal(auto_db, sorted_pl)
    if kind == "overlap":  # one rank: the sorted window is the definition
        got = auto_pl.filter(pl.col("used_events_max").is_not_null()).select("pool", "t_ns", "used_events_max")
        assert_frame_equal(got, numpy_used_events_max(path, 10**9))


def test_churn_engines_agree_on_multi_segment_trace(tmp_path):
    path = random_trace(tmp_path / "t", seed=9, events=4000, segments=3)
    a = churn(path, window="250ms").collect()
    b = churn(path, window="250ms", engine="duckdb").pl()
    assert_frame_equal(a, b)
    df = pl.concat([pl.read_parquet(f).with_columns(pl.col("pool", "op").cast(pl.String))
                    for f in path.glob("pool/rank=0/*.parquet")])
    allocs = df.filter((pl.col("op") == "alloc") & pl.col("pool").is_in(KV))["num_slots"].sum()
    assert a["alloc_tokens"].sum() == allocs


def test_pools_without_allocator_rows_keep_their_stats_rows(tmp_path):
    """DuckDB's streaming path skips the running sums of pools without alloc/free rows; the
    rows (stats only, or none at all) are the same as the ordered window's."""
    from tests.analysis.conftest import write_trace

    rows = {"pool": [dict(ts_ns=1, seq=1, pool="full", op="clear", num_slots=16),
                     dict(ts_ns=2, seq=2, pool="swa", op="alloc", num_slots=8)],
            "stats": [dict(ts_ns=3, seq=3, pool="host_full", capacity=64, available=60)]}
    path = write_trace(tmp_path / "t", rows)
    frames = _all_paths(path, "1s")
    for df in frames.values():
        assert_frame_equal(df, frames[("polars", False)])
    assert frames[("duckdb", True)].select("pool", "used", "used_events_max").rows() == [
        ("host_full", 4, None), ("swa", None, 8)]
