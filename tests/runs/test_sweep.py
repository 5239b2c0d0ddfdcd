"""``kvtrace sweep`` / ``compare``: cross product, hive layout, resume, failures, Ray."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from tests.runs.conftest import SMALL

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]  # sweeps of real-backend runs

GRID = ["max_running_requests=2,4"]


@pytest.fixture(scope="module")
def swept(small_workload, tmp_path_factory):
    from replay.runs.sweep import sweep

    out = tmp_path_factory.mktemp("sweep") / "R"
    df = sweep(small_workload, out, policies=["baseline", "swa-fixes"], grid=GRID, sets=SMALL, jobs=2)
    return out, df


def test_layout_and_summary_table(swept):
    import polars as pl

    out, df = swept
    runs = sorted(str(p.relative_to(out).parent) for p in out.rglob("summary.json"))
    assert runs == ["policy=baseline/max_running_requests=2", "policy=baseline/max_running_requests=4",
                    "policy=swa-fixes/max_running_requests=2", "policy=swa-fixes/max_running_requests=4"]
    table = pl.read_parquet(out / "summary.parquet")
    assert table.height == 4 and set(table["status"]) == {"ok"}
    for row in table.iter_rows(named=True):
        s = json.loads((out / row["run"] / "summary.json").read_text())
        assert s["settings"]["max_running_requests"] == int(row["max_running_requests"])
        assert s["policy"] == row["policy"] and s["peak_swa_used"] == row["peak_swa_used"]
    # a run under policy=<p>/ folders reads like any trace (the folder keys are not columns)
    from replay.trace import open_trace

    tr = open_trace(out / runs[0])
    lf = tr.lazy("stats").collect()
    assert lf.height > 0 and "policy" not in lf.columns and set(lf["rank"]) == {0}
    assert tr.relation("stats").aggregate("count(*)").fetchall()[0][0] == lf.height
    # hive layout: DuckDB reads the tree with partition columns
    import duckdb

    n = duckdb.sql(f"SELECT count(DISTINCT policy) FROM read_parquet('{out}/**/stats/rank=*/*.parquet', "
                   "hive_partitioning=true)").fetchall()[0][0]
    assert n == 2


def test_runs_are_forked_by_one_warm_zygote(swept):
    """Linux: one zygote imported sglang; each run's child imported none of the backend itself."""
    out, _ = swept
    results = [json.loads(p.read_text()) for p in sorted((out / ".partial").glob("*.result.json"))]
    assert len(results) == 4 and {r["status"] for r in results} == {"ok"}
    assert (out / ".partial" / "zygote.log").is_file()
    for r in results:
        t = r["timing"]
        assert t["preloaded_modules"] == 0, t  # sglang, torch and replay came with the fork
        assert t["replay_s"] >= t["record_s"] > 0 and t["write_s"] >= 0 and t["cpu_s"] > 0
        assert (out / ".partial" / r["run"].replace("/", "__")).with_suffix(".log").is_file()


def test_resume_skips_done_and_redoes_interrupted(swept, small_workload):
    from replay.runs.sweep import sweep

    out, _ = swept
    keep = out / "policy=swa-fixes/max_running_requests=4"
    mtime = (keep / "summary.json").stat().st_mtime_ns
    gone = out / "policy=baseline/max_running_requests=2"
    shutil.rmtree(gone)  # as if that run had been interrupted before its rename
    (out / ".partial" / "junk").mkdir(parents=True)
    df = sweep(small_workload, out, policies=["baseline", "swa-fixes"], grid=GRID, sets=SMALL, jobs=1)
    assert set(df["status"]) == {"ok"} and df.height == 4
    assert (keep / "summary.json").stat().st_mtime_ns == mtime
    assert (gone / "summary.json").is_file() and not (out / ".partial" / "junk").exists()


def test_compare_deltas_against_base(swept):
    from replay.runs.compare import compare, format_table

    out, _ = swept
    df = compare(out)
    assert df["policy"].to_list() == ["baseline", "baseline", "swa-fixes", "swa-fixes"]
    for row in df.iter_rows(named=True):
        base = json.loads((out / f"policy=baseline/max_running_requests={row['max_running_requests']}"
                           / "summary.json").read_text())
        assert row["peak_swa_used_delta"] == row["peak_swa_used"] - base["peak_swa_used"]
        assert row["prefix_hit_ratio_delta"] == pytest.approx(row["prefix_hit_ratio"] - base["prefix_hit_ratio"])
    text = format_table(df, width=1000)  # wide enough for policies as rows
    assert text.splitlines()[0].startswith("policy") and "swa-fixes" in text
    other = compare(out, base="swa-fixes")
    assert other["policy"][0] == "swa-fixes"
    assert (other.filter(other["policy"] == "swa-fixes")["finished_delta"] == 0).all()


def test_one_failed_run_does_not_stop_the_others(small_workload, tmp_path):
    from replay.cli import main

    out = tmp_path / "F"
    # 16390 is no multiple of the page size: that run fails inside its worker, the other completes
    # (the sweep's handling is what is tested: reference runs, not two sglang imports)
    r = CliRunner().invoke(main, ["sweep", str(small_workload), "--policies", "swa-fixes", "--grid",
                                  "full_pool_tokens=16384,16390", "--out", str(out), "--jobs", "2", "--json",
                                  "--backend", "reference", *[x for kv in SMALL[1:] for x in ("--set", kv)]])
    assert r.exit_code == 1, r.output
    res = json.loads(r.output.strip().splitlines()[-1])
    status = {x["run"]: x["status"] for x in res["runs"]}
    assert status == {"policy=swa-fixes/full_pool_tokens=16384": "ok",
                      "policy=swa-fixes/full_pool_tokens=16390": "failed"}
    assert "not a multiple of page_size" in next(x["error"] for x in res["runs"] if x["status"] == "failed")
    r = CliRunner().invoke(main, ["compare", str(out), "--json"])
    assert r.exit_code == 0 and len(json.loads(r.output)["rows"]) == 1


def test_bad_sweeps_are_refused_before_any_run(small_workload, tmp_path):
    from replay.cli import main

    for args, msg in ((["--policies", "baseline,nope"], "unknown policy 'nope'"),
                      (["--policies", "baseline", "--grid", "page_size=16,x"], "expected an integer"),
                      (["--policies", "eic"], "use --backend reference"),
                      (["--policies", "baseline", "--executor", "k8s"], "Invalid value for '--executor'")):
        r = CliRunner().invoke(main, ["sweep", str(small_workload), "--out", str(tmp_path / "x"), *args])
        assert r.exit_code == 2 and msg in r.output, r.output
        assert not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, ["sweep", str(small_workload), "--policies", "baseline", "--out", str(tmp_path / "full")])
    assert r.exit_code == 2 and "holds no sweep" in r.output
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"


def test_cold_processes_give_the_same_runs(swept, small_workload, tmp_path, monkeypatch):
    """Forked children are as isolated as cold ones: the same summaries apart from measured CPU."""
    from replay.runs import MEASURED
    from replay.runs.sweep import sweep

    monkeypatch.setenv("KVTRACE_SWEEP_ZYGOTE", "0")
    out, _ = swept
    cold = tmp_path / "cold"
    runs = ["policy=baseline/max_running_requests=2", "policy=swa-fixes/max_running_requests=2"]
    df = sweep(small_workload, cold, policies=["baseline", "swa-fixes"], grid=["max_running_requests=2"],
               sets=SMALL, jobs=2)
    assert set(df["status"]) == {"ok"} and not (cold / ".partial" / "zygote.log").exists()
    for run in runs:
        a, b = (json.loads((d / run / "summary.json").read_text()) for d in (out, cold))
        for k in (*MEASURED, "run"):
            a.pop(k), b.pop(k)
        assert a == b, run
    t = json.loads((cold / ".partial" / f"{runs[0].replace('/', '__')}.result.json").read_text())["timing"]
    assert t["preloaded_modules"] > 100  # a cold process imports the backend itself


@pytest.mark.slow
def test_ray_executor_writes_the_same_layout(small_workload, tmp_path):
    from replay.runs.sweep import sweep

    # the executor is what is tested: reference runs (two sglang imports in Ray's workers took
    # ~160 s of a 2-core CI machine; the sglang backend's runs are the same job files)
    out = tmp_path / "ray"
    df = sweep(small_workload, out, policies=["swa-fixes"], grid=["max_running_requests=2,4"], sets=SMALL,
               jobs=2, executor="ray", backend="reference")
    assert set(df["status"]) == {"ok"}, df.select("run", "error").to_dicts()
    assert sorted(str(p.relative_to(out).parent) for p in out.rglob("summary.json")) == [
        "policy=swa-fixes/max_running_requests=2", "policy=swa-fixes/max_running_requests=4"]


def test_compare_refuses_a_foreign_summary_json(tmp_path):
    from replay.cli import main

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "summary.json").write_text('{"hello": 1}')
    r = CliRunner().invoke(main, ["compare", str(tmp_path)])
    assert r.exit_code == 2 and "not a kvtrace run summary (missing requests" in r.output, r.output
    assert "Traceback" not in r.output
