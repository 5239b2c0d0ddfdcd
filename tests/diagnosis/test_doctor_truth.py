"""``doctor`` tells the truth: no recommendation of what the trace already runs, shares of SWA
capacity x span in [0, 1] by construction, one exit-status rule with ``verify``, human output
without ``None``, Python reprs or wrong plurals."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.cli import main
from replay.diagnosis.columns import Stats
from replay.diagnosis.doctor import _recommend, doctor
from replay.diagnosis.shares import bound_holders
from tracer.schema import Pool

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = sorted(p for p in (ROOT / "data" / "incidents").iterdir() if (p / "manifest.json").is_file())
AB = ROOT / "data" / "traces" / "ab"


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_knob_already_recorded_is_not_recommended():
    """The swa-fixes run already frees out-of-window SWA every window (interval 128 = W): the
    private-range cause is reported, its knob said to be on, and nothing is recommended."""
    rep = doctor(AB / "swa-fixes")
    assert rep.recorded_knobs["swa_eviction_interval_tokens"] == 128
    rec = {r["cause"]: r for r in rep.recommendations}["private_range_kept_until_finish"]
    assert rec["status"] == "already_on" and rec["sets"] == []
    assert rec["already_on"] == ["swa_eviction_interval_tokens=128"]
    assert rep.fix_sets == [] and rep.fix_env == {}
    out = _cli("doctor", AB / "swa-fixes").output
    assert "already on private_range_kept_until_finish: swa_eviction_interval_tokens=128 is recorded" in out
    assert not re.search(r"^recommend  private_range", out, re.M)
    assert "recommend  none: every knob that addresses these causes is already on" in out


def test_recorded_env_switch_moves_to_the_next_cause(tmp_path):
    """window_lock recorded with SGLANG_OPT_RELEASE_PREFILL_SWA=true (backend.json env) must not
    be told to set it."""
    t = tmp_path / "t"
    shutil.copytree(ROOT / "data" / "incidents" / "window_lock", t)
    bj = json.loads((t / "backend.json").read_text())
    bj["env"] = {"SGLANG_OPT_RELEASE_PREFILL_SWA": "1"}
    (t / "backend.json").write_text(json.dumps(bj))
    rep = doctor(t)
    rec = {r["cause"]: r for r in rep.recommendations}["window_lock_held_through_decode"]
    assert rec["status"] == "already_on" and rec["env"] == {}
    assert "SGLANG_OPT_RELEASE_PREFILL_SWA" not in rep.fix_env


def test_recommend_compares_each_value():
    w = 32
    rec = _recommend("unfinished_insert_without_release", w,
                     {"swa_out_of_window_release": "decode_only"}, {})
    assert rec["status"] == "recommended" and rec["sets"] == ["swa_out_of_window_release=decode_and_unfinished_insert"]
    rec = _recommend("unfinished_insert_without_release", w,
                     {"swa_out_of_window_release": "decode_and_unfinished_insert"}, {})
    assert rec["status"] == "already_on" and rec["sets"] == []
    # an interval shorter than the window frees every window too; a longer one does not
    assert _recommend("private_range_kept_until_finish", w, {"swa_eviction_interval_tokens": 16})["status"] == "already_on"
    assert _recommend("private_range_kept_until_finish", w, {"swa_eviction_interval_tokens": 10**6})["sets"] == [
        "swa_eviction_interval_tokens=32"]
    # not recorded at all: still recommended; a bug has no knob
    assert _recommend("private_range_kept_until_finish", w, {})["status"] == "recommended"
    assert _recommend("slots_lost_by_allocator", w, {})["status"] == "no_knob"


@pytest.mark.parametrize("trace", INCIDENTS + [AB / "baseline", AB / "swa-fixes"], ids=lambda p: p.name)
def test_shares_bounded_on_bundled_traces(trace):
    rep = doctor(trace)
    for c in rep.causes:
        assert 0.0 <= c["share_of_swa_capacity"] <= 1.0, c
    cap_span = _cap_span(trace)
    for h in rep.holders:
        assert 0.0 <= h["slot_seconds"] <= cap_span * (1 + 1e-9), h


def _cap_span(trace) -> float:
    from replay.diagnosis.columns import load_stats
    from replay.diagnosis.shares import Grid
    from replay.trace import open_trace

    return Grid(load_stats(open_trace(trace), 0)).capacity_slot_seconds


@st.composite
def _pool_and_claims(draw):
    n = draw(st.integers(2, 30))
    cap = draw(st.integers(1, 5000))
    ts = np.cumsum(np.array(draw(st.lists(st.integers(0, 10**10), min_size=n, max_size=n)), dtype=np.int64))
    avail = np.array(draw(st.lists(st.integers(0, cap), min_size=n, max_size=n)), dtype=np.int64)
    z = np.zeros(n, dtype=np.int64)
    stats = Stats(np.arange(n), ts, z, np.full(n, int(Pool.SWA)), np.full(n, cap), avail, z, z, z)
    lo, hi = int(ts[0]) - 10**10, int(ts[-1]) + 10**10
    holders = []
    for _ in range(draw(st.integers(1, 12))):
        a, b = sorted(draw(st.lists(st.integers(lo, hi), min_size=2, max_size=2)))
        holders.append({"holder": "h", "rid": 1, "since_ns": a, "until_ns": b,
                        "cause": draw(st.sampled_from(["window_lock_held_through_decode", "all_tombstone_last_leaf"])),
                        "slots": draw(st.integers(0, 10**7)),
                        "slot_seconds": float(draw(st.floats(0, 1e12, allow_nan=False)))})
    return stats, holders


@settings(max_examples=200)
@given(_pool_and_claims())
def test_shares_bounded_by_construction(case):
    """Whatever the holders claim (overlapping, outside the span, more slots than the pool),
    every holder and every cause stays within capacity x span, and a cause within its slots in use."""
    stats, holders = case
    bounded, by_cause, grid = bound_holders(holders, stats)
    total = grid.capacity_slot_seconds
    assert all(0 <= h["slot_seconds"] <= total * (1 + 1e-9) + 1e-6 for h in bounded)
    assert all(h["slots"] <= int(stats.capacity.max()) for h in bounded)
    used_total = float(np.sum((stats.capacity - stats.available) * grid.dt_s))
    for cause, v in by_cause.items():
        assert 0 <= v <= total * (1 + 1e-9) + 1e-6
        assert 0 <= grid.share(v) <= 1
        if cause != "all_tombstone_last_leaf":
            assert v <= used_total * (1 + 1e-9) + 1e-6


def test_exit_status_rule(tmp_path):
    """0 stable/ok, 1 leak or growth found, 2 refused input: doctor and verify alike."""
    inc = ROOT / "data" / "incidents"
    assert _cli("doctor", inc / "healthy_chat").exit_code == 0
    assert _cli("doctor", inc / "lost_free").exit_code == 1  # leak
    assert _cli("doctor", inc / "lost_unlock").exit_code == 1  # growing
    assert _cli("verify", inc / "healthy_chat").exit_code == 0
    assert _cli("verify", inc / "lost_free").exit_code == 1
    for cmd in ("doctor", "verify"):
        res = _cli(cmd, ROOT / "data" / "workloads" / "multi_turn")
        assert res.exit_code == 2 and res.output.startswith("kvtrace: error: "), res.output
        res = _cli(cmd, tmp_path)
        assert res.exit_code == 2 and res.output.startswith("kvtrace: error: "), res.output


@pytest.mark.parametrize("trace", INCIDENTS + [AB / "swa-fixes"], ids=lambda p: p.name)
def test_human_output_has_no_reprs(trace):
    for cmd in ("doctor", "verify"):
        out = _cli(cmd, trace).output
        assert out and "Traceback" not in out
        for bad in ("None", "np.", "[", "+-", " 1 holders", " 1 rows", " 1 slots", " 1 samples", " 1 events"):
            assert bad not in out, (cmd, bad, out)
