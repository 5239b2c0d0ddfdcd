"""``kvtrace replay``: a run is a trace written by the hooks on the real code plus summary.json."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.runs.conftest import SMALL

pytestmark = pytest.mark.sglang

KEYS = {"requests", "finished", "peak_full_used", "peak_swa_used", "mean_swa_used",
        "swa_used_slope_tokens_per_hour", "prefix_hit_ratio", "host_hit_ratio", "ttft_p50_ms", "ttft_p99_ms",
        "queue_p99_ms", "throughput_tokens_per_s", "retractions", "swa_evicted_tokens", "host_alloc_cpu_ns",
        "host_free_cpu_ns", "sched_cpu_ns", "sim_s", "wall_s"}


@pytest.fixture(scope="module")
def run_a(small_workload, tmp_path_factory):
    from replay.runs import replay_run

    out = tmp_path_factory.mktemp("runs") / "a"
    return out, replay_run(small_workload, out, policy="swa-fixes", sets=SMALL)


def test_run_is_a_trace_plus_summary(run_a, small_workload):
    import polars as pl

    from replay.trace import open_trace

    out, s = run_a
    on_disk = json.loads((out / "summary.json").read_text())
    assert KEYS <= set(on_disk)
    assert s.requests == 12 and s.finished + s.aborted == 12 and s.finished > 0
    tr = open_trace(out)
    assert tr.problems == []
    assert tr.manifest["run"]["policy"] == "swa-fixes"
    assert tr.manifest["run"]["settings"]["full_pool_tokens"] == 16384
    assert "page_size" in tr.manifest["run"]["assumed"]  # a workload records no sizes
    assert "full_pool_tokens" not in tr.manifest["run"]["assumed"]
    # figures agree with the trace they summarize
    stats = tr.lazy("stats").filter(pl.col("pool") == "swa").collect()
    assert s.peak_swa_used == int((stats["capacity"] - stats["available"]).max())
    req = tr.lazy("request").collect()
    fin = req.filter(pl.col("event") == "finish")
    assert s.prefix_hit_ratio == pytest.approx(fin["cached_len"].sum() / fin["input_len"].sum(), abs=1e-6)
    assert 0 < s.ttft_p50_ms <= s.ttft_p99_ms
    assert s.sim_s > 0 and s.wall_s > 0 and s.sched_cpu_ns > 0
    assert s.throughput_tokens_per_s > 0


def test_replay_is_deterministic_and_recorded_repeats_a_run(run_a, tmp_path):
    from replay.runs import MEASURED, replay_run

    out, a = run_a
    b = replay_run(out, tmp_path / "b", policy="recorded")  # a run replays under its own settings
    da, db = a.to_dict(), b.to_dict()
    for k in ("run", "source", "policy", "assumed", *MEASURED):
        da.pop(k), db.pop(k)
    assert da == db


#: columns that hold wall-clock or CPU measurements, not decisions
TIMING = {"ts_ns", "dur_ns", "step_ns"}


def test_python_tree_core_replays_row_for_row(small_workload, tmp_path):
    """With ``tree_core=python`` two replays write the same rows in the same order in every
    family (timings aside). With sglang's Rust core (the default) the order of a node's FULL
    and SWA frees within one free group follows the core's hash-map order (randomly seeded),
    so only the summaries are asserted equal there (docs/replay.md, Determinism)."""
    from replay.runs import replay_run
    from replay.trace import open_trace
    from tracer.schema import FAMILIES

    sets = (*SMALL, "tree_core=python")
    for name in ("a", "b"):
        replay_run(small_workload, tmp_path / name, policy="swa-fixes", sets=sets)
    a, b = open_trace(tmp_path / "a"), open_trace(tmp_path / "b")
    for fam in FAMILIES:
        if fam == "drops":
            continue
        ta, tb = a.table(fam), b.table(fam)
        cols = [c for c in ta.column_names if c not in TIMING]
        assert ta.num_rows == tb.num_rows and ta.select(cols).equals(tb.select(cols)), fam
    assert a.table("pool").num_rows > 100


def test_policy_changes_the_run(small_workload, run_a, tmp_path):
    from replay.runs import replay_run

    b = replay_run(small_workload, tmp_path / "b", policy="baseline", sets=SMALL)
    assert b.settings["swa_lru_refresh"] == "full_ancestry" and b.settings["tree_core"] == "auto"
    assert "swa_admission=all_or_nothing" in b.patches and "swa_lru_refresh=full_ancestry" in b.patches
    assert b.to_dict() != run_a[1].to_dict()


def test_cli_replay_json_and_errors(small_workload, tmp_path):
    from replay.cli import main

    r = CliRunner().invoke(main, ["replay", str(small_workload), "--policy", "swa-fixes", "--out",
                                  str(tmp_path / "r"), "--json", *[x for kv in SMALL for x in ("--set", kv)]])
    assert r.exit_code == 0, r.output
    assert KEYS <= set(json.loads(r.output.strip().splitlines()[-1]))
    for args, msg in ((["--policy", "nope"], "known presets: recorded"),
                      (["--set", "page_size=x"], "page_size='x': expected an integer"),
                      (["--policy", "eic"], "use --backend reference"),
                      (["--set", "full_pool_tokens=1000"], "not a multiple of page_size")):
        r = CliRunner().invoke(main, ["replay", str(small_workload), "--out", str(tmp_path / "x"), *args])
        assert r.exit_code == 2, r.output
        assert msg in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["replay", str(small_workload), "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "already exists" in r.output and "--force" in r.output
