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


def _r(ratio, hit=None, ttft=None):
    if hit is None:
        return {"swa_full_tokens_ratio": ratio, "status": "stopped", "feasible": False}
    return {"swa_full_tokens_ratio": ratio, "status": "ok", "feasible": True, "prefix_hit_ratio": hit,
            "ttft_p99_ms": ttft if ttft is not None else 1000 - 1000 * hit}


@pytest.mark.parametrize("hits, declined", [
    ([None, 0.077, 0.121, 0.117, 0.109], True),  # production_1h at 4 GB: down twice past the best
    ([None, 0.077, 0.121, 0.117], False),  # once is not yet a trend
    ([0.077, 0.121, 0.117, 0.119], False),  # down, then up again: go on
    ([0.121, 0.121, 0.110, 0.100], False),  # a tie past the best is not worse
    ([0.077, 0.121, None, None], True),  # past the best only infeasible splits (the full pool too small)
    ([0.077, 0.121, 0.110, None], True),
    ([0.121, 0.110, 0.100, 0.130], False),  # the best is the last: nothing past it
])
def test_the_search_stops_once_the_curve_has_turned_down(hits, declined):
    from replay.runs.plan import _best, _declined

    rows = [_r(0.02 * (k + 1), h) for k, h in enumerate(hits)]
    best = _best(rows, "hit_ratio")
    assert _declined(rows, best, "hit_ratio") == declined
    # the TTFT objective reads its own figure: here TTFT falls as hits rise
    assert _declined(rows, _best(rows, "ttft_p99"), "ttft_p99") == declined


def test_a_plan_stops_on_a_declining_curve(long_outputs, tmp_path, monkeypatch):
    import replay.runs.plan as plan_mod

    monkeypatch.setattr(plan_mod, "EARLY_STOP_SHARE", 2.0)  # never by the attainable ratio here
    ratios = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
    res = plan(long_outputs, tmp_path / "d", kv_gb=0.25, model="mellum-like-swa", ratios=ratios, jobs=1)
    # golden: 0.1-0.3 retract, 0.4 serves all (hit 0.371875), 0.5 and 0.75 retract: stop before 1.0
    assert res.early_stopped and res.early_stop_reason == "declining"
    assert [r["status"] for r in res.rows] == ["stopped"] * 3 + ["ok"] + ["stopped"] * 2
    assert res.best["swa_full_tokens_ratio"] == 0.4 and res.best["prefix_hit_ratio"] == 0.371875
    full = plan(long_outputs, tmp_path / "f", kv_gb=0.25, model="mellum-like-swa", ratios=ratios, jobs=1,
                early_stop=False)
    # the split it did not run is feasible (feasibility is not monotone in the ratio) but worse
    assert full.rows[-1]["feasible"] and full.rows[-1]["prefix_hit_ratio"] == 0.06875
    assert full.best["swa_full_tokens_ratio"] == 0.4


def test_running_out_a_plan_that_stopped_its_splits_is_refused(both, long_outputs):
    from replay.runs.summary import RunError

    stop, _ = both
    out = stop.rows[0]["run"].split("/policy=")[0]
    with pytest.raises(RunError, match=r"ratios 0.1, 0.25, 1 stopped at their first retraction"):
        plan(long_outputs, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False,
             stop_infeasible=False)
    r = CliRunner().invoke(main, ["plan", str(long_outputs), "--kv-gb", str(KV_GB), "--model", "mellum-like-swa",
                                  "--ratios", ",".join(map(str, RATIOS)), "--out", out, "--run-infeasible"])
    assert r.exit_code != 0 and "choose a new --out" in r.output and "Traceback" not in r.output


def test_the_report_shows_where_each_stopped_split_ended(both, tmp_path):
    from pathlib import Path

    from replay.report import build_report

    stop, _ = both
    out = Path(stop.rows[0]["run"].split("/policy=")[0])
    build_report(out, tmp_path / "r.html", diagnose=False)
    page = (tmp_path / "r.html").read_text()
    assert page.count("stopped at its first retraction/abort") == 3
    assert "infeasible (replay stopped at its first retraction" in page  # the figure's legend
