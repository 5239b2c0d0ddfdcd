"""Figures-only runs (``detail="figures"``, :mod:`replay.backends.figures`): the summary computed
as the replay runs, with no trace, is the traced run's summary figure for figure (measured CPU
aside) on the bundled workloads under several policies, HiCache, retractions, a run stopped at
its first retraction and GB figures; the tracer's emits are routed only while no recorder runs
and are no-ops again afterwards, an interrupt included."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracer
from replay.backends.base import FIGURES, Interrupted, RunObserver, record_trace
from replay.runs.replay import replay_run
from replay.runs.summary import MEASURED, RunError, read_summary
from tests.runs.conftest import multi_turn_rows

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"
NOT_COMPARED = set(MEASURED) | {"run", "traced"}


@pytest.fixture(scope="module")
def long_outputs(tmp_path_factory):
    from replay.backends.sglang import write_workload

    rows = multi_turn_rows(sessions=4, output_tokens=300, gap_ns=20_000_000)
    return write_workload(tmp_path_factory.mktemp("wl") / "w", rows, hash_block_tokens=16)


CASES = [
    ("mixed", "swa-fixes", []),
    ("multi_turn", "baseline", []),
    ("agentic", "recorded", ["host_pool_tokens=300000", "page_size=32"]),  # HiCache: host hits and host CPU
    ("shared_prefix", "eic", ["page_size=8", "host_pool_tokens=200000"]),
    ("long_context", "swa-fixes", ["page_size=1"]),
]


def _both(source, tmp_path: Path, policy: str, sets: list, **kw) -> tuple[dict, dict]:
    traced = replay_run(source, tmp_path / "traced", policy=policy, sets=sets, backend="reference", **kw).to_dict()
    bare = replay_run(source, tmp_path / "bare", policy=policy, sets=sets, backend="reference", detail=FIGURES,
                      **kw).to_dict()
    assert traced["traced"] and not bare["traced"]
    assert [p.name for p in (tmp_path / "bare").iterdir()] == ["summary.json"]  # no trace written
    assert read_summary(tmp_path / "bare").to_dict() == bare
    return traced, bare


def _same(traced: dict, bare: dict) -> None:
    diff = {k: (traced[k], bare[k]) for k in traced if k not in NOT_COMPARED and traced[k] != bare[k]}
    assert diff == {}


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    return {name: _both(WORKLOADS / name, tmp_path_factory.mktemp(name), policy, sets)
            for name, policy, sets in CASES}


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_a_figures_only_summary_is_the_traced_summary(bundled, name):
    _same(*bundled[name])


def test_the_comparison_covers_every_kind_of_figure(bundled):
    """Each figure read from rows is nonzero in some case (else the equality says nothing of it)."""
    traced = [t for t, _ in bundled.values()]
    for k in ("prefix_hit_ratio", "host_hit_ratio", "swa_evicted_tokens", "swa_released_tokens", "peak_full_used",
              "peak_swa_used", "mean_swa_used", "swa_used_slope_tokens_per_hour", "ttft_p99_ms"):
        assert any(t[k] for t in traced), k
    host = bundled["agentic"]
    assert host[0]["host_alloc_cpu_ns"] > 0 and host[1]["host_alloc_cpu_ns"] > 0  # measured, so only > 0


def test_retractions_a_stopped_run_and_gb_figures_agree(long_outputs, tmp_path):
    sets = ["full_pool_tokens=7968", "swa_pool_tokens=1984"]  # retracts (tests/runs/test_plan_stop.py)
    traced, bare = _both(long_outputs, tmp_path / "whole", "recorded", sets, model="mellum-like-swa")
    _same(traced, bare)
    assert traced["retractions"] > 0 and traced["swa_pool_gb"] and traced["mean_swa_used_gb"]
    traced, bare = _both(long_outputs, tmp_path / "cut", "recorded", sets + ["stop_on_retraction=on"],
                         model="mellum-like-swa")
    _same(traced, bare)
    assert bare["stopped"] == "first_retraction" and bare["finished"] < bare["requests"]


def test_figures_only_is_the_reference_backends(long_outputs, tmp_path):
    with pytest.raises(RunError, match="reference backend's"):
        replay_run(long_outputs, tmp_path / "s", backend="sglang", detail=FIGURES)
    assert not (tmp_path / "s").exists()


def test_route_refuses_while_recording_and_needs_every_emit(tmp_path):
    rec = tracer.start(tmp_path / "t", clock="manual")
    try:
        with pytest.raises(RuntimeError, match="recording"):
            tracer.route({})
    finally:
        tracer.stop()
    with pytest.raises(RuntimeError, match="no function for"):
        tracer.route({"pool": lambda *a: None})
    assert tracer.pool is tracer.DISABLED["pool"] and rec.stopped


def test_an_interrupted_figures_only_run_leaves_the_emits_off(tmp_path):
    from replay.workloads import read_workload

    wl = read_workload(WORKLOADS / "mixed")
    seen = []

    def run_loop(observer):
        tracer.request(0, 1)
        seen.append(tracer.pool is tracer.DISABLED["pool"])
        raise KeyboardInterrupt("SIGTERM")

    with pytest.raises(Interrupted, match="interrupted by SIGTERM"):
        record_trace(wl, tmp_path / "r", run_loop, source="test", server={}, env={}, detail=FIGURES,
                     flush_interval_ms=100, manifest_extra=None, on_progress=None, observer_cls=RunObserver)
    assert seen == [False]  # routed while the loop ran
    assert tracer.pool is tracer.DISABLED["pool"] and tracer.request is tracer.DISABLED["request"]
    assert not (tmp_path / "r" / "manifest.json").exists()


def test_a_plan_runs_its_splits_figures_only_and_reports_them(long_outputs, tmp_path):
    """The plan's rows are those of a plan that keeps traces; its report is the plan section alone."""
    from replay.report import build_report
    from replay.runs.plan import plan

    kw = dict(kv_gb=0.2, model="mellum-like-swa", ratios=(0.25, 0.5), jobs=2, early_stop=False)
    bare, traced = plan(long_outputs, tmp_path / "bare", **kw), plan(long_outputs, tmp_path / "traced", traces=True, **kw)
    assert not bare.config.traces and traced.config.traces

    def rows(res, name):
        return [r | {"run": r["run"].replace(f"/{name}/", "/")} for r in res.rows]

    assert rows(bare, "bare") == rows(traced, "traced") and bare.best["swa_full_tokens_ratio"] == 0.5
    assert not list((tmp_path / "bare").rglob("manifest.json"))
    assert len(list((tmp_path / "traced" / "policy=recorded").rglob("manifest.json"))) == 2
    res = build_report(tmp_path / "bare", tmp_path / "r.html", diagnose=False)
    page = (tmp_path / "r.html").read_text()
    assert "Capacity plan (0.2 GB)" in page and "figures-only" in page and res["plan"]["best"] == bare.best
    assert "<h2>Evidence</h2>" not in page and "<h2>Details</h2>" not in page  # no empty headings


def test_the_cli_says_a_run_is_figures_only_and_report_refuses_it_by_name(long_outputs, tmp_path):
    from click.testing import CliRunner

    from replay.cli import main

    out = tmp_path / "r"
    r = CliRunner().invoke(main, ["replay", str(long_outputs), "--backend", "reference", "--detail", "figures",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "figures only (--detail figures): no trace written" in r.output
    r = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and "a figures-only run (--detail figures) wrote no trace" in r.output
    assert "Traceback" not in r.output


def test_a_capacity_sweep_runs_figures_only_and_a_traced_resume_refuses_it(tmp_path):
    """The curve's rows are those of a sweep that keeps traces (measured CPU and wall aside)."""
    from replay.runs.capacity import capacity_sweep

    kw = dict(pool="swa", sizes_tokens=(8192, 32768), model="mellum-like-swa", jobs=2)
    bare = capacity_sweep(WORKLOADS / "mixed", tmp_path / "bare", **kw)
    traced = capacity_sweep(WORKLOADS / "mixed", tmp_path / "traced", traces=True, **kw)
    assert not bare.config.traces and traced.config.traces

    def rows(res):
        return [{k: v for k, v in r.items() if k not in ("run", "wall_s")} for r in res.rows]

    assert rows(bare) == rows(traced) and bare.rows[0]["prefix_hit_ratio"] == 0.088729  # the golden
    assert not list((tmp_path / "bare").rglob("manifest.json"))
    with pytest.raises(RunError, match="kept no trace in this capacity sweep"):
        capacity_sweep(WORKLOADS / "mixed", tmp_path / "bare", traces=True, **kw)
