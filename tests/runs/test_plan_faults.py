"""``kvtrace plan`` (and ``capacity``) as a hostile user meets them: the disk fills mid-sweep (``RLIMIT_FSIZE``, as in
``test_disk_full``) and the plan is SIGKILLed mid-sweep. A failed split is unknown, not
infeasible: the plan says it is incomplete (exit 1, one error line, nothing recommended; before,
it told the user to raise --kv-gb), and the same command run again resumes to the very plan an
uninterrupted run makes. A SIGKILLed plan leaves no replay process behind."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.faults.util import KVTRACE, assert_clean_failure, file_size_limit, run

pytestmark = pytest.mark.slow

RATIOS = "0.1,0.25,0.5,1.0"


def _plan_args(workload, out, *extra):
    return ["plan", workload, "--kv-gb", "0.4", "--model", "mellum-like-swa", "--ratios", RATIOS,
            "--no-early-stop", "--out", out, "--json", *extra]


def _rows(res_or_path, out):
    d = json.loads(res_or_path.stdout) if hasattr(res_or_path, "stdout") else json.loads(res_or_path.read_text())
    return [{k: v for k, v in r.items() if k != "run"} | {"run": r["run"].replace(str(out), "OUT")}
            for r in d["rows"]]


@pytest.fixture(scope="module")
def whole(small_workload, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "p"
    res = run(*_plan_args(small_workload, out, "--jobs", "2"))
    assert res.returncode == 0, res.stderr
    return _rows(res, out)


def test_a_full_disk_makes_the_plan_incomplete_and_a_rerun_resumes_it(small_workload, whole, tmp_path):
    """With --traces (the splits' traces fill the disk). The rerun's rows, every split traced, are
    those of the figures-only plan (``whole``)."""
    out = tmp_path / "p"
    res = run(*_plan_args(small_workload, out, "--jobs", "2", "--traces"), preexec_fn=file_size_limit(20_000))
    assert_clean_failure(res, str(out), "splits failed", "File too large", "the plan is incomplete", code=1)
    assert res.stderr.count("kvtrace: error:") == 1 and "raise --kv-gb" not in res.stdout + res.stderr
    plan = json.loads(res.stdout)
    assert plan["best"] is None and plan["server_args"] == [] and plan["failed"]
    assert all("File too large" in f["error"] for f in plan["failed"])
    assert {r["status"] for r in plan["rows"]} <= {"ok", "failed"}
    if any(r["status"] == "ok" for r in plan["rows"]):  # the report shows the plan as incomplete
        from replay.report import build_report

        build_report(out, tmp_path / "r.html", diagnose=False)
        page = (tmp_path / "r.html").read_text()
        assert "the plan is incomplete" in page and "failed: RecordingFailed" in page
    else:  # nothing to draw: the report refuses, quoting the plan's note
        assert_clean_failure(run("report", out, "--out", tmp_path / "r.html"), "a plan with no completed split",
                             "the plan is incomplete", code=2)
    again = run(*_plan_args(small_workload, out, "--jobs", "2", "--traces"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["failed"] == [] and _rows(again, out) == whole
    assert list((out / "policy=recorded").rglob("manifest.json")), "--traces kept no trace"


def test_a_full_disk_under_a_figures_only_plan_is_one_clean_error_and_a_rerun_resumes_it(small_workload, whole,
                                                                                        tmp_path):
    """Figures-only splits write a summary each; the sweep's table is the first file the limit stops.
    Before, polars' wrapped OSError came out as an unexpected error (exit 3)."""
    out = tmp_path / "p"
    res = run(*_plan_args(small_workload, out, "--jobs", "2"), preexec_fn=file_size_limit(4_000))
    assert_clean_failure(res, "summary.parquet", "could not write the sweep's table", "File out of specification",
                         "run the same command again", code=1)
    assert not list((out / "policy=recorded").rglob("manifest.json")), "a figures-only split wrote a trace"
    again = run(*_plan_args(small_workload, out, "--jobs", "2"))
    assert again.returncode == 0, again.stderr
    assert _rows(again, out) == whole
    # the splits kept no trace: a --traces plan refuses to resume them (rather than deleting them)
    assert_clean_failure(run(*_plan_args(small_workload, out, "--traces")), "kept no trace", "choose a new --out",
                         code=2)


def _session_pids(sid: int) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.getsid(int(p)) == sid:
                    pids.append(int(p))
            except OSError:
                pass
    return pids


def test_a_sigkilled_plan_leaves_no_process_and_resumes_to_the_same_plan(small_workload, whole, tmp_path):
    out = tmp_path / "p"
    p = subprocess.Popen([KVTRACE, *map(str, _plan_args(small_workload, out, "--jobs", "1"))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not list(out.glob("policy=*/**/summary.json")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if p.poll() is not None:
        pytest.fail(f"the plan ended before the kill: {p.stderr.read()[-2000:]}")
    p.kill()
    p.communicate(timeout=60)
    deadline = time.monotonic() + 30  # the zygote and its replay notice their parent's death
    while _session_pids(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session_pids(p.pid) == []
    done = len(list(out.glob("policy=*/**/summary.json")))
    assert 1 <= done < len(RATIOS)  # killed mid-sweep
    again = run(*_plan_args(small_workload, out, "--jobs", "2"))
    assert again.returncode == 0, again.stderr
    assert _rows(again, out) == whole
    assert json.loads((out / "plan.json").read_text())["best"] is not None


def test_a_capacity_curve_with_failed_sizes_is_an_error_and_a_rerun_fills_it(small_workload, tmp_path):
    out = tmp_path / "c"
    args = ["capacity", small_workload, "--sizes", "4096,8192", "--model", "mellum-like-swa", "--out", out, "--json",
            "--traces"]  # the sizes' traces fill the disk
    res = run(*args, preexec_fn=file_size_limit(20_000))
    assert_clean_failure(res, str(out), "2 of 2 size(s) failed", "File too large", code=1)
    assert res.stderr.count("kvtrace: error:") == 1
    assert {r["status"] for r in json.loads(res.stdout)["rows"]} == {"failed"}
    again = run(*args)
    assert again.returncode == 0, again.stderr
    assert {r["status"] for r in json.loads(again.stdout)["rows"]} == {"ok"}
