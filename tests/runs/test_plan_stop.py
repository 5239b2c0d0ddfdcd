"""A plan's infeasible splits end at their first retraction or abort (``stop_on_retraction``).

The replay of a split is the same up to its first retraction or abort whether it goes on or not,
so that event alone rules the split out: the plan stops it there and recommends what the full
runs recommend. Checked on a workload whose sessions' long outputs make small full pools retract.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.runs.plan import plan
from tests.reference.rows import reference_rows
from tests.runs.conftest import multi_turn_rows

RATIOS = (0.1, 0.25, 0.5, 1.0)
KV_GB = 0.2  # 0.1 and 0.25 retract, 1.0 (3,472 full tokens) aborts, 0.5 serves every request


@pytest.fixture(scope="module")
def long_outputs(tmp_path_factory):
    from replay.backends.sglang import write_workload

    rows = multi_turn_rows(sessions=4, output_tokens=300, gap_ns=20_000_000)
    return write_workload(tmp_path_factory.mktemp("wl") / "w", rows, hash_block_tokens=16)


@pytest.fixture(scope="module")
def both(long_outputs, tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    kw = dict(kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False)
    return (plan(long_outputs, d / "stop", **kw), plan(long_outputs, d / "full", stop_infeasible=False, **kw))


def test_infeasible_splits_stop_and_the_recommendation_is_the_full_runs_one(both):
    stop, full = both
    assert stop.config.stop_infeasible and not full.config.stop_infeasible
    assert [r["status"] for r in full.rows] == ["ok"] * 4
    assert [r["feasible"] for r in full.rows] == [False, False, True, False]
    assert [r["status"] for r in stop.rows] == ["stopped", "stopped", "ok", "stopped"]
    def figures(row):
        return {k: v for k, v in row.items() if k != "run"}

    assert figures(stop.best) == figures(full.best) and stop.best["swa_full_tokens_ratio"] == 0.5
    assert stop.server_args == full.server_args
    for s, f in zip(stop.rows, full.rows):
        if s["status"] == "stopped":
            assert not s["feasible"] and s["stopped"] == "first_retraction"
            assert s["retractions"] + s["aborted"] >= 1 and s["finished"] < f["finished"]
            assert 0 < s["stopped_at_s"] and "prefix_hit_ratio" not in s  # partial figures are not shown
        else:
            assert figures(s) == figures(f)


def test_a_stopped_replay_is_the_full_replay_up_to_its_first_retraction(long_outputs, tmp_path):
    sets = ["full_pool_tokens=7968", "swa_pool_tokens=1984"]  # ratio 0.25 of 0.2 GB
    full = reference_rows(long_outputs, tmp_path / "full", "recorded", sets)
    cut = reference_rows(long_outputs, tmp_path / "cut", "recorded", sets + ["stop_on_retraction=on"])
    assert sorted(cut) == sorted(full)
    shorter = 0
    for fam in full:
        assert cut[fam] == full[fam][:len(cut[fam])], fam
        shorter += len(cut[fam]) < len(full[fam])
    assert shorter  # it did stop early
    # no step before the stop retracted or aborted a request; the last ones did
    first = next(i for i, r in enumerate(full["sched"]) if r["kind"] == "retract")
    assert not [r for r in full["request"] if r["event"] == "abort" and r["seq"] < full["sched"][first]["seq"]]
    assert cut["sched"][first]["kind"] == "retract" and len(cut["sched"]) - first < 50


def test_the_cli_table_says_where_a_split_stopped(both, long_outputs):
    stop, _ = both
    out = stop.rows[0]["run"].split("/policy=")[0]
    r = CliRunner().invoke(main, ["plan", str(long_outputs), "--kv-gb", str(KV_GB), "--model", "mellum-like-swa",
                                  "--ratios", ",".join(map(str, RATIOS)), "--out", out, "--no-early-stop"])
    assert r.exit_code == 0, r.output
    assert r.output.count("infeasible: first retraction at") == 3 and "* recommended" in r.output


def test_the_real_backend_refuses_to_stop_early(long_outputs, tmp_path):
    from replay.runs.replay import replay_run
    from replay.runs.summary import RunError

    with pytest.raises(RunError, match="stop_on_retraction=on cannot be expressed by the sglang backend"):
        replay_run(long_outputs, tmp_path / "r", sets=["stop_on_retraction=on"], backend="sglang")
