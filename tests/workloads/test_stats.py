"""Golden statistics on a tiny hand-made workload (the Mooncake fixture)."""

from __future__ import annotations

import pytest

from replay.workloads.bailian import import_bailian
from replay.workloads.io import read_workload
from replay.workloads.mooncake import import_mooncake
from replay.workloads.stats import format_stats, workload_stats

REQUIRED = ["requests", "sessions", "arrival_rate_per_s", "input_len_p50", "input_len_p99",
            "output_len_p50", "ideal_reuse_ratio"]


def test_mooncake_fixture_golden_numbers(tmp_path, fixture_path):
    s = workload_stats(read_workload(import_mooncake(fixture_path("mooncake_small.jsonl"), tmp_path / "W")))
    assert list(s)[: len(REQUIRED)] == REQUIRED
    assert s["requests"] == 6
    assert s["sessions"] == 6  # no session ids: every request is its own session
    assert s["arrival_rate_per_s"] == pytest.approx(5 / 3.0)
    # inputs sorted: 300 600 1024 1100 1536 2100
    assert s["input_len_p50"] == pytest.approx(1062.0)
    assert s["input_len_p99"] == pytest.approx(1536 + 0.95 * (2100 - 1536))
    assert s["output_len_p50"] == pytest.approx(8.0)  # 1 5 7 9 20 100
    # reused full 512-token blocks: row 2 (2 of [0,1,3]), row 4 (1: [0]), row 6 (2: [0,1])
    assert s["ideal_reused_tokens"] == 5 * 512
    assert s["total_input_tokens"] == 6660
    assert s["ideal_reuse_ratio"] == pytest.approx(2560 / 6660)
    assert s["duration_s"] == 3.0
    assert s["context_len_max"] == 2200
    assert s["context_len_histogram"]["0k-4k"] == 6
    assert "ideal prefix reuse" in format_stats(s)


def test_bailian_fixture_sessions_and_reuse(tmp_path, fixture_path):
    s = workload_stats(read_workload(import_bailian(fixture_path("bailian_small.jsonl"), tmp_path / "W")))
    assert s["requests"] == 5 and s["sessions"] == 3
    assert s["turns_per_session_mean"] == pytest.approx(5 / 3)
    assert s["arrival_rate_per_s"] == pytest.approx(4 / 9.5)
    # hashed blocks per row: 2, 1, 4, 6, 2; seen before: 0, 1, 2, 4, 2 -> 9 blocks of 16 tokens
    assert s["ideal_reused_tokens"] == 9 * 16
    assert s["ideal_reuse_ratio"] == pytest.approx(144 / (40 + 20 + 70 + 96 + 33))
