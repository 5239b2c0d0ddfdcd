"""``kvtrace doctor`` names the cause of every bundled incident trace and says stable for the
healthy twins; the trend test on synthetic series."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.diagnosis.doctor import doctor
from replay.diagnosis.make_incidents import INCIDENTS
from replay.diagnosis.trend import NS_PER_HOUR, trend

DATA = Path(__file__).resolve().parents[2] / "data" / "incidents"


@pytest.mark.parametrize("inc", [i for i in INCIDENTS if i.cause], ids=lambda i: i.name)
def test_incident_cause_named(inc):
    res = CliRunner().invoke(main, ["doctor", str(DATA / inc.name), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert {"identity_violations", "growth", "holders", "causes", "recommendations"} <= set(d)
    assert d["primary_cause"] == inc.cause, d["causes"]
    assert d["recommendations"][0]["cause"] == inc.cause
    assert all({"slope_tokens_per_hour", "p_value", "verdict"} <= set(g) for g in d["growth"].values())
    if inc.cause == "slots_lost_by_allocator":
        v = {x["pool"]: x for x in d["identity_violations"]}["swa"]
        assert v["growth_pages"] > 0 and d["growth"]["swa"]["verdict"] == "growing"
        assert d["growth"]["swa"]["hours_to_exhaustion"] > 0
    if inc.cause == "protected_prefix_pinned":
        assert d["growth"]["swa"]["verdict"] == "growing" and not d["identity_violations"]


@pytest.mark.parametrize("name", [i.name for i in INCIDENTS if not i.cause])
def test_healthy_is_stable(name):
    rep = doctor(DATA / name)
    assert rep.verdict == "stable" and not rep.identity_violations
    assert all(g["verdict"] == "stable" for g in rep.growth.values()), rep.growth
    assert rep.primary_cause not in {i.cause for i in INCIDENTS if i.cause} - {"window_lock_held_through_decode"}


def test_recommendations_name_knobs():
    rep = doctor(DATA / "unfinished_insert")
    rec = rep.recommendations[0]
    assert "swa_out_of_window_release=decode_and_unfinished_insert" in rec["knobs"]
    assert rec["sets"] == ["swa_out_of_window_release=decode_and_unfinished_insert"]


def test_trend_flat_noise_and_rise():
    rng = np.random.default_rng(0)
    t = np.arange(200) * 10**9 * 18  # one sample per 18 s: an hour
    flat = trend(t, rng.integers(0, 3, 200) * 16)
    assert flat.p_value > 0.05 and abs(flat.slope_tokens_per_hour) < 1
    rise = trend(t, 1000 + np.arange(200) * 16 + rng.integers(0, 3, 200) * 16)
    assert rise.p_value < 1e-6
    assert rise.slope_tokens_per_hour == pytest.approx(16 * 200 * NS_PER_HOUR / (t[-1] - t[0] + 18e9), rel=0.05)
