"""``kvtrace diff`` on reference runs: identical replays, and two policies that part ways."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.differential.cases import CASES, write_case_workload


def test_diff_identical_and_diverging_runs(tmp_path):
    from replay.cli import main
    from replay.runs.diff import diff_runs
    from replay.runs.replay import replay_run

    case = CASES[7]
    wl = tmp_path / "wl"
    write_case_workload(case, wl)
    for name, policy in (("a", "swa-fixes"), ("b", "swa-fixes"), ("c", "eic")):
        replay_run(wl, tmp_path / name, policy=policy, sets=case.sets(), backend="reference", progress=False)
    same = diff_runs(tmp_path / "a", tmp_path / "b")
    assert same.identical and same.steps_a == same.steps_b > 0
    runner = CliRunner()
    res = runner.invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.output)
    assert out["first_step"] is not None and out["metrics"]
    assert {m["metric"] for m in out["metrics"]} & {"swa_used", "evicted_swa", "full_used"}
    assert out["context"] and any(r["step"] == out["first_step"] for r in out["context"])
    res = runner.invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b")])
    assert res.exit_code == 0 and "identical" in res.output
    res = runner.invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--metric", "nope"])
    assert res.exit_code == 2 and "unknown metric" in res.output
