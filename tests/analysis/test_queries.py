"""Exact numbers of the query library on the hand-built trace of conftest.small_rows()."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from replay.analysis import (churn, compare_runs, holdings, host_allocator_cpu, lifetimes, occupancy,
                             prefix_hit_ratio, prefix_hits, reuse_intervals)
from tests.analysis.conftest import S


def test_occupancy_exact(small_trace):
    df = occupancy(small_trace, pools=("full", "swa"), resample="1s").collect()
    assert df.select("pool", "t_ns", "used", "evictable", "protected", "held", "used_events_max").rows() == [
        ("full", 0, 48, 16, 32, 0, 48),
        ("full", 1 * S, None, None, None, None, 32),
        ("full", 2 * S, 0, 0, 0, 0, 0),
        ("swa", 0, 32, 0, 0, 32, 32),
        ("swa", 1 * S, 16, 0, 0, 16, 16),
    ]


@pytest.mark.parametrize("resample", ["1s", "250ms", 100_000_000])
def test_occupancy_duckdb_and_polars_agree_row_for_row(small_trace, resample):
    a = occupancy(small_trace, resample=resample).collect()
    b = occupancy(small_trace, resample=resample, engine="duckdb").pl()
    assert_frame_equal(a, b)


def test_churn_exact(small_trace):
    df = churn(small_trace, window="1s", pools=("full", "swa")).collect()
    assert df.select("pool", "t_ns", "alloc_tokens", "free_tokens", "alloc_ops", "free_ops",
                     "evicted_tokens", "evict_ops", "tombstones", "retractions").rows() == [
        ("full", 0, 48, 0, 2, 0, 0, 0, 0, 0),
        ("full", S, 0, 16, 0, 1, 16, 1, 0, 0),
        ("full", 2 * S, 0, 32, 0, 1, 64, 1, 0, 1),
        ("swa", 0, 32, 0, 1, 0, 0, 0, 0, 0),
        ("swa", S, 0, 16, 0, 1, 16, 1, 1, 0),
    ]
    assert df["alloc_tokens_per_s"].to_list()[0] == 48.0
    # mean evicted tokens of full = 80/3; only 64 > 1.5 * 26.7 is a burst
    bursts = churn(small_trace, window="1s", pools=("full",), burst_factor=1.5).collect()
    assert bursts["eviction_burst"].to_list() == [False, False, True]


@pytest.mark.parametrize("window", ["1s", "500ms"])
def test_churn_duckdb_and_polars_agree_row_for_row(small_trace, window):
    assert_frame_equal(churn(small_trace, window=window).collect(),
                       churn(small_trace, window=window, engine="duckdb").pl())


def test_prefix_hits_count_each_request_once(small_trace):
    df = prefix_hits(small_trace).collect()
    assert df.select("rid", "matches", "hit_tokens", "source").rows() == [
        (0, 2, 32, "finish"),  # matched twice, counted once: the finish row's cached_len
        (1, 1, 64, "last_match"),  # no finish row: device 48 + host 16 of its last match
    ]
    assert prefix_hit_ratio(small_trace) == pytest.approx(96 / 144)


def test_holdings_exact(small_trace):
    df = holdings(small_trace).collect()
    # 48 tokens (32 prefix + 16) for 0.3 s, then 64 tokens for 1.0 s, plus 10 decode tokens
    # growing linearly over the last 1.0 s
    assert df["rid"].to_list() == [0]
    assert df["slot_seconds"][0] == pytest.approx(48 * 0.3 + 64 * 1.0 + 10 * 1.0 / 2)
    assert df["peak_tokens"][0] == 74 and df["held_s"][0] == pytest.approx(1.3)
    sess = holdings(small_trace, by="session").collect()
    assert sess.select("session_id", "requests").rows() == [(5, 1)]


def test_lifetimes_and_reuse(small_trace):
    lt = lifetimes(small_trace).collect()
    assert lt.select("page_hash", "depth", "uses", "hits").rows() == [
        (11, 0, 2, 1), (12, 1, 2, 1), (13, 2, 2, 0), (14, 3, 2, 0), (15, 4, 1, 0)]
    # request 0's cached_len 32 covers pages 0-1; request 1 has no finish row, so its uses miss
    assert lt["evicted_by_ns"].to_list()[:4] == [16 * S // 10] * 4
    ri = reuse_intervals(small_trace).collect()
    assert ri["interval_s"].to_list() == [pytest.approx(1.5)] * 4


def test_host_allocator_cpu(small_trace):
    c = host_allocator_cpu(small_trace, pools=("full", "swa"))
    per_op = c.per_op.collect()
    assert per_op.select("pool", "op", "ops", "total_ns").rows() == [
        ("full", "alloc", 2, 3000), ("full", "free", 2, 1200), ("swa", "alloc", 1, 3000),
        ("swa", "free", 1, 500)]
    assert per_op["share_of_step_pct"][0] == pytest.approx(100 * 3000 / 30_000)
    steps = c.per_step.collect()
    assert steps.select("forward_ct", "alloc_cpu_ns", "ops").rows() == [(1, 4000, 2), (2, 2000, 1)]
    vs = c.vs_free_list.collect()
    assert vs.filter(pl.col("pool") == "full")["free_list_slots"].to_list() == [None, 96, 80, 80]
    assert host_allocator_cpu(small_trace).per_op.collect().height == 0  # no host pools here


def test_compare_runs_reads_hive_layout(tmp_path):
    import json

    for pol, k in (("baseline", 1024), ("swa-fixes", 1024), ("swa-fixes", 2048)):
        d = tmp_path / "RUNS" / f"policy={pol}" / f"swa_pool_tokens={k}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(
            {"policy": pol, "peak_swa_used": k // 2 if pol == "baseline" else k // 4,
             "settings": {"swa_pool_tokens": k}}))
    df = compare_runs(tmp_path / "RUNS", base="policy=baseline/swa_pool_tokens=1024")
    assert df.select("policy", "swa_pool_tokens", "peak_swa_used", "peak_swa_used_vs_base").rows() == [
        ("baseline", "1024", 512, 1.0), ("swa-fixes", "1024", 256, 0.5), ("swa-fixes", "2048", 512, 1.0)]
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        compare_runs(tmp_path / "nothing_here" if (tmp_path / "nothing_here").mkdir() is None else None)


def test_bad_arguments_name_the_setting(small_trace):
    with pytest.raises(ValueError, match="resample='soon'"):
        occupancy(small_trace, resample="soon")
    with pytest.raises(ValueError, match="unknown pool"):
        churn(small_trace, pools=("gpu",))
    with pytest.raises(ValueError, match="engine='spark'"):
        occupancy(small_trace, engine="spark")
