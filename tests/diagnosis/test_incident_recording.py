"""The incident recorder and ``doctor --replay`` on the real sglang 0.5.23 classes:
``make_incidents`` regenerates a bundled incident trace equal by content, ``doctor --replay``
says the problem disappears under the recommended policy, ``kvtrace record --incident`` refuses
what it cannot plant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.diagnosis import make_incidents
from replay.trace import open_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "incidents"
FAMILIES = ("request", "sched", "cache", "pool", "stats")
# measured on the machine (perf_counter spans), not part of what the run did
MEASURED = {"dur_ns", "step_ns", "cpu_ns", "wall_ns"}


def _content(path: Path, family: str, cols: list[str] | None = None) -> pa.Table:
    t = open_trace(path).table(family, 0)
    keep = [c for c in t.column_names if c not in MEASURED and (cols is None or c in cols)]
    t = t.select(keep)
    return t.take(pa.array(np.argsort(t.column("seq").to_numpy(), kind="stable")))


@pytest.mark.slow
@pytest.mark.sglang
def test_make_incidents_regenerates_equal_content(tmp_path):
    name = "lost_unlock"
    made = make_incidents.make((name,), root=tmp_path, progress=False)
    assert [m["trace"] for m in made] == [f"data/incidents/{name}"]
    new, old = tmp_path / name, DATA / name
    for fam in FAMILIES:
        a = _content(old, fam)
        b = _content(new, fam, a.column_names)
        assert a.column_names == b.column_names, fam
        assert a.num_rows == b.num_rows, fam
        for c in a.column_names:
            assert a.column(c).to_pylist() == b.column(c).to_pylist(), f"{fam}.{c}"
    bj_old, bj_new = (json.loads((p / "backend.json").read_text()) for p in (old, new))
    assert bj_new["incident"] == bj_old["incident"] and bj_new["incident"]["planted"] > 0
    common = set(bj_new["settings"]) & set(bj_old["settings"])  # settings gain and lose knobs over time
    assert {k: bj_new["settings"][k] for k in common} == {k: bj_old["settings"][k] for k in common}
    assert bj_new["result"]["num_finished"] == bj_old["result"]["num_finished"]


@pytest.mark.slow
@pytest.mark.sglang
def test_doctor_replay_growth_disappears():
    res = CliRunner().invoke(main, ["doctor", str(DATA / "lost_unlock"), "--replay", "--json"])
    assert res.exit_code == 1, res.output  # the diagnosed trace grows (exit 1), whatever the replay says
    d = json.loads(res.output)
    r = d["replay"]
    assert r["incident"]["name"] == "lost_unlock"  # planted again from backend.json
    assert r["runs"]["recorded"]["verdict"] == "growing"
    assert r["runs"]["recorded"]["primary_cause"] == "protected_prefix_pinned"
    assert r["runs"]["recommended"]["verdict"] == "stable"
    assert "protected_prefix_pinned" not in r["runs"]["recommended"]["causes"]
    assert r["growth_disappears"] is True and "disappears" in r["summary"]


def test_record_incident_refusals(tmp_path):
    wl = tmp_path / "w"
    wl.mkdir()
    run = CliRunner().invoke
    res = run(main, ["record", "--workload", str(wl), "--out", str(tmp_path / "o"), "--incident", "nope"])
    assert res.exit_code != 0 and "--incident nope: unknown incident; known: lost_free" in res.output
    res = run(main, ["record", "--workload", str(wl), "--out", str(tmp_path / "o"),
                     "--incident", "all_tombstone_leaf_insert"])
    assert res.exit_code != 0 and "needs --set tree_core=python" in res.output
    res = run(main, ["record", "--workload", str(wl), "--out", str(tmp_path / "o"),
                     "--incident", "lost_free", "--incident-every", "0"])
    assert res.exit_code != 0 and "expected >= 1" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()
