"""``kvtrace plan`` (``replay.runs.plan``): the split arithmetic, refusals, a plan on a small
multi-turn workload (golden best split, resumable, early stop, infeasible budgets) and its CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.runs.plan import plan, split
from replay.runs.summary import RunError

MELLUM = {"full": 14336.0, "swa": 43008.0}  # replay.models "mellum-like-swa"
RATIOS = (0.1, 0.25, 0.5, 1.0)
KV_GB = 0.4  # 26,448 / 13,216 tokens at ratio 0.5: the 12 requests' 9 K-token sessions compete


def test_split_spends_the_budget_in_whole_pages():
    f, s = split(1.0, 0.25, MELLUM, 16)
    assert (f, s) == (39856, 9952)
    for r in (0.02, 0.1, 0.5, 1.0, 4.0):
        f, s = split(1.0, r, MELLUM, 16)
        spent = f * MELLUM["full"] + s * MELLUM["swa"]
        assert f % 16 == 0 and s % 16 == 0 and spent <= 1e9
        assert spent > 1e9 - 16 * (MELLUM["full"] + MELLUM["swa"]) - 16 * MELLUM["swa"] * (1 + r)
    assert split(1e-9, 0.5, MELLUM, 16) == (16, 16)  # at least a page each


@pytest.mark.parametrize("kw, msg", [
    (dict(kv_gb=0), "--kv-gb 0"), (dict(kv_gb=-1), "--kv-gb -1"), (dict(kv_gb=float("nan")), "--kv-gb nan"),
    (dict(kv_gb=float("inf")), "--kv-gb inf"), (dict(kv_gb=1e9), "at most 100000"),
    (dict(kv_gb=1, objective="speed"), "--objective 'speed'"), (dict(kv_gb=1, ratios=[0]), r"in \(0, 4\]"),
    (dict(kv_gb=1, ratios=[5]), r"in \(0, 4\]"), (dict(kv_gb=1, host_gb=-2), "--host-gb -2"),
    (dict(kv_gb=1, model="gpt-17"), "gpt-17"),
    (dict(kv_gb=1), "no bytes per token"),  # a workload records none: --model is needed
])
def test_refusals_name_what_is_wrong(small_workload, tmp_path, kw, msg):
    with pytest.raises(RunError, match=msg):
        plan(small_workload, tmp_path / "p", **kw)
    assert not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def planned(small_workload, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "p"
    return out, plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2,
                     early_stop=False)


def test_a_plan_replays_each_split_and_recommends_the_best_feasible_one(planned):
    out, res = planned
    assert [r["swa_full_tokens_ratio"] for r in res.rows] == list(RATIOS) and not res.early_stopped
    for r in res.rows:
        assert r["status"] == "ok" and r["full_pool_tokens"], r
        assert r["full_gb"] + r["swa_gb"] <= KV_GB + 1e-9
        assert r["feasible"] == (r["finished"] == r["requests"] and r["retractions"] == 0 and r["aborted"] == 0)
    feasible = [r for r in res.rows if r["feasible"]]
    assert res.best is not None and res.best["prefix_hit_ratio"] == max(r["prefix_hit_ratio"] for r in feasible)
    # golden: every split but the largest SWA share keeps the sessions' history (a tie goes to the
    # smaller SWA share); ratio 1.0 leaves 6,960 full tokens and loses a third of the hits
    assert [r["full_pool_tokens"] for r in res.rows] == [21456, 15936, 11152, 6960]
    assert [r["prefix_hit_ratio"] for r in res.rows] == [0.60625, 0.60625, 0.60625, 0.405556]
    assert res.best["swa_full_tokens_ratio"] == 0.1 and res.attainable_hit_ratio == 0.60625
    assert res.server_args == ["--swa-full-tokens-ratio", f"{res.best['swa_full_tokens_ratio']:g}",
                               "--max-total-tokens", str(res.best["full_pool_tokens"])]
    assert 0 < res.attainable_hit_ratio <= 1 and all(r["prefix_hit_ratio"] <= res.attainable_hit_ratio + 1e-9
                                                     for r in feasible)
    saved = json.loads((out / "plan.json").read_text())
    assert saved["best"]["swa_full_tokens_ratio"] == res.best["swa_full_tokens_ratio"]
    assert saved["config"]["kv_gb"] == KV_GB and saved["bytes_per_token"]["full"] == MELLUM["full"]


def test_a_plan_resumes_and_can_add_splits(planned, small_workload):
    out, res = planned
    again = plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS + (0.05,), jobs=2,
                 early_stop=False)
    assert [r["swa_full_tokens_ratio"] for r in again.rows] == [0.05, *RATIOS]
    assert [r for r in again.rows if r["swa_full_tokens_ratio"] != 0.05] == res.rows  # the same runs, kept


def test_ttft_objective_and_early_stop(planned, small_workload, tmp_path, monkeypatch):
    _, res = planned
    t = plan(small_workload, tmp_path / "t", kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2,
             objective="ttft_p99", early_stop=False)
    feasible = [r for r in t.rows if r["feasible"]]
    assert t.best["ttft_p99_ms"] == min(r["ttft_p99_ms"] for r in feasible)
    # by default the search stops once a split reaches 99 % of the attainable hit ratio
    e = plan(small_workload, tmp_path / "e", kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2)
    assert e.early_stopped and len(e.rows) == 1  # the first split is already there
    assert e.early_stop_reason == "attainable"
    # the runs it cut are reported skipped in the sweep's table (killed or never started)
    import polars as pl

    table = pl.read_parquet(tmp_path / "e" / "summary.parquet")
    assert set(table["status"][1:]) <= {"skipped", "ok"} and "skipped" in set(table["status"])
    assert all("stopped early (attainable) after ratio" in x for x in table.filter(pl.col("status") == "skipped")["error"])
    # where the search ends depends on the figures only, not on how many run at a time
    one = plan(small_workload, tmp_path / "e1", kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=1)
    assert one.rows == [r | {"run": r["run"].replace("/e/", "/e1/")} for r in e.rows] and one.best == one.rows[0]
    assert max(r["prefix_hit_ratio"] for r in e.rows if r["feasible"]) >= 0.99 * e.attainable_hit_ratio
    # the runs the stop killed or never started are resumed by a plan that runs every ratio
    whole = plan(small_workload, tmp_path / "e", kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2,
                 early_stop=False)
    assert [r["swa_full_tokens_ratio"] for r in whole.rows] == list(RATIOS)
    assert all(r["status"] in ("ok", "stopped") for r in whole.rows) and whole.rows[0] == e.rows[0]
    assert set(pl.read_parquet(tmp_path / "e" / "summary.parquet")["status"]) <= {"ok"}


def test_a_budget_no_split_survives_says_so(small_workload, tmp_path):
    res = plan(small_workload, tmp_path / "x", kv_gb=0.002, model="mellum-like-swa", ratios=(0.25,), jobs=1)
    assert res.best is None and res.server_args == [] and "raise --kv-gb" in res.notes[0]
    # the SWA pool is below a page: the backend refuses the settings, which rules the split out as
    # a retraction would (not a failure to retry: the plan is complete)
    assert [r["status"] for r in res.rows] == ["refused"] and res.failed == []
    assert "too small for page_size" in res.rows[0]["error"]


def test_cli_table_json_and_errors(planned, small_workload, tmp_path):
    out, res = planned
    r = CliRunner().invoke(main, ["plan", str(small_workload), "--kv-gb", str(KV_GB), "--model", "mellum-like-swa",
                                  "--ratios", ",".join(map(str, RATIOS)), "--out", str(out), "--no-early-stop"])
    assert r.exit_code == 0, r.output
    assert "server arguments: " + " ".join(res.server_args) in r.output and "* recommended" in r.output
    j = CliRunner().invoke(main, ["plan", str(small_workload), "--kv-gb", str(KV_GB), "--model", "mellum-like-swa",
                                  "--ratios", ",".join(map(str, RATIOS)), "--out", str(out), "--json",
                                  "--no-early-stop"])
    assert j.exit_code == 0 and json.loads(j.output)["best"]["run"] == res.best["run"]
    bad = CliRunner().invoke(main, ["plan", str(small_workload), "--kv-gb", "1", "--ratios", "a,b",
                                    "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--ratios 'a,b'" in bad.output and "Traceback" not in bad.output


def test_the_report_of_a_plan_draws_its_curves(planned, tmp_path):
    from replay.report import build_report

    out, res = planned
    rep = build_report(out, tmp_path / "r.html", diagnose=False)
    assert rep["plan"]["server_args"] == res.server_args
    page = (tmp_path / "r.html").read_text()
    assert "Capacity plan (0.4 GB)" in page and "--swa-full-tokens-ratio 0.1" in page and "knee at ratio 0.1" in page


def test_kvtrace_report_of_a_plan_names_the_recommendation(planned, tmp_path):
    """The command's line names the plan's recommended arguments (not "0 figures": a plan's report
    has no evidence figures, only its own section)."""
    out, res = planned
    r = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert f"capacity plan, recommended {' '.join(res.server_args)}" in r.output and "0 figures" not in r.output


def test_the_report_of_an_incomplete_plan_says_so(planned, tmp_path):
    import shutil

    from replay.report import build_report
    from replay.runs.plan import incomplete_message

    out, _ = planned
    copy = tmp_path / "p"
    shutil.copytree(out, copy)
    saved = json.loads((copy / "plan.json").read_text())  # as a plan whose last split failed writes it
    saved["rows"][-1] = {k: saved["rows"][-1][k] for k in ("swa_full_tokens_ratio", "full_pool_tokens",
                                                           "swa_pool_tokens", "full_gb", "swa_gb", "run")}
    saved["rows"][-1] |= {"status": "failed", "feasible": False, "error": "RecordingFailed: disk <full>"}
    saved["failed"] = [{"swa_full_tokens_ratio": 1.0, "error": "RecordingFailed: disk <full>"}]
    saved["best"], saved["server_args"] = None, []
    saved["notes"] = [incomplete_message(saved["failed"], len(saved["rows"]))]
    (copy / "plan.json").write_text(json.dumps(saved))
    build_report(copy, tmp_path / "r.html", diagnose=False)
    page = (tmp_path / "r.html").read_text()
    assert "1 of 4 splits failed (ratio 1: RecordingFailed: disk &lt;full&gt;" in page
    assert "failed: RecordingFailed: disk &lt;full&gt;" in page and "recommended:" not in page


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_confirm_reruns_the_winner_and_its_neighbours_on_the_real_backend(planned, small_workload):
    out, res = planned
    c = plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False,
             confirm=True)
    assert [r["swa_full_tokens_ratio"] for r in c.confirm] == [0.1, 0.25]  # the winner (first) and its neighbour
    for r in c.confirm:
        assert set(r) >= {"reference_hit_ratio", "real_hit_ratio", "hit_diff", "peak_swa_rel_diff", "agrees"}
        assert r["agrees"] == (r["hit_diff"] <= 0.01 and r["peak_swa_rel_diff"] <= 0.02)
        assert (out / "confirm" / f"policy=recorded/swa_full_tokens_ratio={r['swa_full_tokens_ratio']}").is_dir()
    assert any("parts from the reference" in n for n in c.notes) == (not all(r["agrees"] for r in c.confirm))
    assert c.reference_best is None and c.best["swa_full_tokens_ratio"] == res.best["swa_full_tokens_ratio"]
    # golden: on these 12 requests the real sglang backend gives the reference's very figures
    assert [(r["real_hit_ratio"], r["real_peak_swa"], r["agrees"]) for r in c.confirm] == \
        [(0.60625, 1456, True), (0.60625, 1936, True)]


def test_cli_says_why_a_split_failed_and_exits_1_without_a_feasible_one(small_workload, tmp_path):
    r = CliRunner().invoke(main, ["plan", str(small_workload), "--kv-gb", "0.00001", "--model", "mellum-like-swa",
                                  "--ratios", "0.5", "--out", str(tmp_path / "p"), "--quiet"])
    assert r.exit_code == 1 and "raise --kv-gb" in r.output and "too small for page_size" in r.output
    assert "Traceback" not in r.output


def _fake_confirm(res, real_hits: dict, real_feasible: dict | None = None):
    """What ``_confirm`` returns when the real backend gives ``real_hits`` (ratio -> hit ratio) at
    the reference winner and its neighbour (peak SWA as the reference's)."""
    from replay.runs.plan import HIT_TOLERANCE

    rows, reals = [], []
    for ref in res.rows[:2]:  # the winner 0.1 and its neighbour 0.25 (the first split: no lower one)
        r = ref["swa_full_tokens_ratio"]
        ok = (real_feasible or {}).get(r, True)
        reals.append(ref | {"prefix_hit_ratio": real_hits[r], "feasible": ok, "retractions": 0 if ok else 3,
                            "run": f"confirm/{r}", "backend": "sglang"})
        d = abs(real_hits[r] - ref["prefix_hit_ratio"])
        rows.append({"swa_full_tokens_ratio": r, "reference_hit_ratio": ref["prefix_hit_ratio"],
                     "real_hit_ratio": real_hits[r], "reference_peak_swa": ref["peak_swa_used"],
                     "real_peak_swa": ref["peak_swa_used"], "hit_diff": round(d, 6), "peak_swa_rel_diff": 0.0,
                     "real_feasible": ok, "agrees": d <= HIT_TOLERANCE})
    return rows, reals


def test_where_the_real_backend_parts_the_plan_says_so_and_recommends_its_view(planned, small_workload,
                                                                               monkeypatch):
    import replay.runs.plan as P
    from replay.cli.plan import plan_lines

    out, res = planned
    assert res.best["swa_full_tokens_ratio"] == 0.1
    # the real backend parts at the winner 0.1 (hit 0.5) and keeps 0.25 at the reference's 0.60625
    monkeypatch.setattr(P, "_confirm", lambda *a, **k: _fake_confirm(res, {0.1: 0.5, 0.25: 0.60625}))
    c = plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False,
             confirm=True)
    assert [r["agrees"] for r in c.confirm] == [False, True]
    assert c.reference_best["swa_full_tokens_ratio"] == 0.1
    assert c.best["swa_full_tokens_ratio"] == 0.25 and c.best["backend"] == "sglang"
    assert c.best["prefix_hit_ratio"] == 0.60625 and c.best["run"] == "confirm/0.25"
    assert c.server_args == ["--swa-full-tokens-ratio", "0.25", "--max-total-tokens", str(c.best["full_pool_tokens"])]
    assert any("parts from the reference (ratio 0.1: hit 0.6062 -> 0.5000" in n for n in c.notes), c.notes
    assert any("best confirmed split is ratio 0.25" in n and "not the reference's 0.1" in n for n in c.notes)
    # 0.25 is the largest confirmed ratio, with larger ones the real backend never ran
    assert any("edge of the confirmed splits" in n for n in c.notes)
    saved = json.loads((out / "plan.json").read_text())
    assert saved["best"]["swa_full_tokens_ratio"] == 0.25 and saved["reference_best"]["swa_full_tokens_ratio"] == 0.1
    lines = plan_lines(c)
    assert [ln.split()[0] for ln in lines if ln.rstrip().endswith("*")] == ["0.25"]
    assert any(ln.startswith("* recommended (the real backend's view") for ln in lines)
    assert "server arguments: --swa-full-tokens-ratio 0.25" in "\n".join(lines)


def test_a_parting_real_backend_with_the_same_winner_gives_its_figures(planned, small_workload, monkeypatch):
    import replay.runs.plan as P

    out, res = planned
    monkeypatch.setattr(P, "_confirm", lambda *a, **k: _fake_confirm(res, {0.1: 0.7, 0.25: 0.65}))
    c = plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False,
             confirm=True)
    assert c.best["swa_full_tokens_ratio"] == 0.1 and c.best["prefix_hit_ratio"] == 0.7  # the real figures
    assert c.reference_best["prefix_hit_ratio"] == 0.60625
    assert any("parts from the reference" in n for n in c.notes) and not any("best confirmed" in n for n in c.notes)


def test_agreeing_confirm_keeps_the_reference_recommendation(planned, small_workload, monkeypatch):
    import replay.runs.plan as P

    out, res = planned
    monkeypatch.setattr(P, "_confirm", lambda *a, **k: _fake_confirm(res, {0.1: 0.61, 0.25: 0.60625}))
    c = plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False,
             confirm=True)
    assert all(r["agrees"] for r in c.confirm) and c.reference_best is None and c.notes == []
    assert c.best == res.best and c.server_args == res.server_args


def test_no_confirmed_split_feasible_on_the_real_backend_recommends_nothing(planned, small_workload,
                                                                            monkeypatch):
    import replay.runs.plan as P

    out, res = planned
    monkeypatch.setattr(P, "_confirm", lambda *a, **k: _fake_confirm(res, {0.1: 0.3, 0.25: 0.3},
                                                                     {0.1: False, 0.25: False}))
    c = plan(small_workload, out, kv_gb=KV_GB, model="mellum-like-swa", ratios=RATIOS, jobs=2, early_stop=False,
             confirm=True)
    assert c.best is None and c.server_args == [] and c.reference_best["swa_full_tokens_ratio"] == 0.1
    assert any("no confirmed split finishes every request" in n for n in c.notes)
    r = CliRunner().invoke(main, ["plan", str(small_workload), "--kv-gb", str(KV_GB), "--model", "mellum-like-swa",
                                  "--ratios", ",".join(map(str, RATIOS)), "--out", str(out), "--no-early-stop",
                                  "--confirm", "--quiet"])
    assert r.exit_code == 1 and "nothing is recommended" in r.output and "Traceback" not in r.output
