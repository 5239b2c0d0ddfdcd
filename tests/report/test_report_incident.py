"""``kvtrace report`` as an incident document (issue #25): the headline of a bundled incident with
its replayed proof, details as tables (no JSON dumps), all-zero panels as sentences, workloads
refused by ``report`` and ``export perfetto`` alike, and occupancy from the pool ledger when a
trace has no ``stats`` rows."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from replay.analysis.perfetto import perfetto_events
from replay.cli import main
from replay.paths import bundled
from replay.report import build_report
from replay.report import figures as F
from tests.analysis.conftest import small_rows, write_trace


@pytest.mark.timeout(120)
def test_incident_report_headline_and_replayed_proof(tmp_path):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", str(bundled("incidents/lost_unlock")), "--replay", "--out", str(out),
                                  "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["verdict"] == "growing" and res["primary_cause"] == "protected_prefix_pinned"
    cols = res["proof"]["columns"]
    assert [c["label"] for c in cols] == ["recorded (this trace)", "replay, recorded settings"]
    assert cols[0]["verdict"] == "growing" and cols[1]["verdict"] == "stable"  # the planted bug does not replay
    assert "fix is in the server's code" in res["proof"]["conclusion"]
    page = out.read_text()
    head = page[page.index('<section class="headline">'):page.index("<h2>Evidence</h2>")]
    assert "Verdict: " in head and "swa pool: growing" in head and "Primary cause:" in head
    assert "tree path locked by request 2" in head  # the holders that matter
    assert "Replayed proof" in head and "TTFT p99 (ms)" in head
    assert page.index("Replayed proof") < page.index("<h2>Evidence</h2>") < page.index("<h2>Details</h2>")
    assert "<pre>" not in page and '"identity_violations"' not in page  # details are tables, not JSON
    assert "None" not in re.sub(r"<script.*?</script>", "", page, flags=re.S)


@pytest.mark.timeout(120)
def test_recommended_knob_is_replayed_and_shown_as_set_arguments(tmp_path):
    res = build_report(bundled("incidents/private_range_kept"), tmp_path / "r.html", replay=True)
    assert res["recommended_sets"] == ["swa_eviction_interval_tokens=32"]
    labels = [c["label"] for c in res["proof"]["columns"]]
    assert labels == ["recorded (this trace)", "replay, recorded settings", "replay, recommended"]
    rec, fix = res["proof"]["columns"][1], res["proof"]["columns"][2]
    assert fix["sets"][-1] == "swa_eviction_interval_tokens=32"
    assert fix["metrics"]["mean_swa_used"] < rec["metrics"]["mean_swa_used"]
    page = (tmp_path / "r.html").read_text()
    assert "--set swa_eviction_interval_tokens=32" in page


@pytest.mark.parametrize("argv", [["report", "{w}", "--out", "{o}/r.html"],
                                  ["export", "perfetto", "{w}", "--out", "{o}/t.json"]])
def test_workloads_are_refused_naming_what_is_missing(tmp_path, argv):
    w = bundled("traces/workload")
    r = CliRunner().invoke(main, [a.format(w=w, o=tmp_path) for a in argv])
    assert r.exit_code == 2, r.output
    assert "kvtrace: error:" in r.output and "0 pool rows and 0 stats rows" in r.output
    assert "a workload" in r.output and "Traceback" not in r.output
    assert not list(tmp_path.iterdir())  # nothing written


def _no_stats(tmp_path):
    rows = small_rows()
    rows.pop("stats")
    return write_trace(tmp_path / "t", rows)


def test_a_trace_without_stats_rows_has_ledger_occupancy_in_perfetto_and_report(tmp_path):
    trace = _no_stats(tmp_path)
    counters = [e for e in perfetto_events(trace) if e["ph"] == "C"]
    assert counters and {e["name"] for e in counters} <= {"full pool", "swa pool"}
    assert all(set(e["args"]) == {"used"} for e in counters)
    # Σ alloc − Σ free per pool, in seq order: never negative, and the full pool's first alloc is 32
    assert counters[0]["args"]["used"] > 0 and all(e["args"]["used"] >= 0 for e in counters)
    fig = F.occupancy_figure(trace, resample="250ms")
    assert F.empty_reason(fig) is None
    assert any(tr.name == F.LEDGER for tr in fig.data)
    res = build_report(trace, tmp_path / "r.html", resample="250ms")
    assert res["figures"][0].startswith("Pool occupancy")
    assert "from the allocator ledger" in (tmp_path / "r.html").read_text()


def test_all_zero_panels_become_sentences(tmp_path):
    rows = small_rows()
    rows["cache"] = [r for r in rows["cache"] if r["op"] != "evict"]
    trace = write_trace(tmp_path / "t", rows)
    fig = F.churn_figure(trace, window="250ms")
    assert len([a for a in fig.layout.annotations if "evicted" in a.text]) == 0  # no empty evicted panel
    assert any("No evictions" in n for n in F.notes(fig))
    empty = F.metric_bars({"a": {"retractions": 0}, "b": {"retractions": 0}}, ["retractions"], "t")
    assert F.empty_reason(empty) and "retractions (count)" in F.empty_reason(empty)


def test_long_run_labels_are_wrapped():
    w = F.wrap_label("policy=baseline/full_pool_tokens=131072/swa_full_tokens_ratio=0.25", 16)
    assert "<br>" in w and max(len(x) for x in w.split("<br>")) <= 24
    assert w.replace("<br>", "") == "policy=baseline/full_pool_tokens=131072/swa_full_tokens_ratio=0.25"
