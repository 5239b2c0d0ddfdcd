"""Coverage of the installed hooks on the real 0.5.23 (every hook at counts, the right states at
steps), contract mismatches, and coverage written into the rank file of a real capture."""

from __future__ import annotations

import importlib.metadata
import json
import sys

import pytest

import tracer
import tracer.sglang as hooks
from tests.sglang.hooks_fixtures import extend, recording, runtime
from tests.sglang.hooks_util import ledger
from tracer.sglang import hooks as hooks_pkg
from tracer.sglang import targets

pytestmark = pytest.mark.sglang

STEPS_INSTALLED = {"pool.req_to_token", "pool.host", "pool.host_group", "cache.tree",
                   "request.arrival", "request.finish", "sched.batch", "sched.step",
                   "sched.scheduler", "stats.observer"}


@pytest.fixture
def installed():
    from replay.backends.sglang.env import bootstrap

    bootstrap()
    importlib.import_module("sglang.srt.managers.scheduler")  # install() never imports it

    def at(level):
        hooks.install(detail=level)
        return hooks_pkg.coverage()

    try:
        yield at
    finally:
        hooks.uninstall()


def test_every_hook_installed_at_counts(installed):
    cov = installed("counts")
    assert cov["target"] == "sglang-0.5.23" and cov["fingerprint_known"]
    assert {n: h["state"] for n, h in cov["hooks"].items()} == {n: "installed" for n in targets.HOOKS}
    assert cov["state"] == "full" and cov["trace_state"] == "complete"
    assert all(p["accounted"] for p in cov["pools"].values())
    assert set(cov["pools"]) == {"full", "swa", "req_to_token", "host_full", "host_swa"}


def test_steps_installs_the_step_hooks_and_skips_the_rest(installed):
    cov = installed("steps")
    states = {n: h["state"] for n, h in cov["hooks"].items()}
    assert {n for n, s in states.items() if s == "installed"} == STEPS_INSTALLED
    assert {n for n, s in states.items() if s != "installed"} == set(targets.HOOKS) - STEPS_INSTALLED
    assert set(states.values()) == {"installed", "skipped"}
    assert cov["state"] == "full"
    assert not any(p["accounted"] for p in cov["pools"].values())  # steps writes no pool rows


def test_a_changed_signature_is_a_mismatch_and_its_module_is_not_installed(installed, monkeypatch):
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    def match_prefix(self, params, extra=None):  # another code base's parameters
        return None

    monkeypatch.setattr(UnifiedRadixCache, "match_prefix", match_prefix)
    cov = installed("counts")
    h = cov["hooks"]["cache.match"]
    assert h["state"] == "mismatch" and "(self, params, extra=None)" in h["reason"]
    assert "needs (self, params)" in h["reason"]
    assert cov["hooks"]["cache.lock"]["state"] == "mismatch"  # (same hook module: not installed)
    assert cov["hooks"]["pool.device"]["state"] == "installed"
    assert cov["state"] == "partial" and cov["trace_state"] == "partial"
    assert UnifiedRadixCache.__dict__["match_prefix"] is match_prefix  # left unwrapped


def test_a_missing_attribute_is_a_mismatch(installed, monkeypatch):
    from tracer.sglang.hooks import schedule_policy as sp

    c = next(c for c in sp.CONTRACTS if c.method == "add_one_req")
    bad = targets.Contract(c.hook, c.module, c.cls, c.method, c.params,
                           reads=("sglang.srt.managers.schedule_batch:Req.no_such_len",))
    installed("counts")
    ch = targets.check(bad, "counts", None)
    assert ch.state == "mismatch" and "Req.no_such_len" in ch.reason
    gone = targets.Contract("x", c.module, "NoSuchClass", "m")
    assert targets.check(gone, "counts", None).state == "absent"


@pytest.mark.parametrize("version", ["0.5.23.post1", "0.5.23+local"])
def test_a_renamed_build_captures_normally_with_its_coverage(tmp_path, monkeypatch, version):
    """0.5.23 code whose distribution says another version: a real short capture, complete."""
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: version if name == "sglang" else real(name))
    monkeypatch.setattr(sys.modules["tracer.sglang.targets.detect"], "_cache", {})
    with recording(tmp_path / "t") as path, runtime(page_size=16, sliding_window_tokens=32,
                                                    full_pool_tokens=1024, swa_pool_tokens=512,
                                                    max_running_requests=4) as rt:
        out = extend(rt.allocator, [0], [64], [-1])
        rt.allocator.free_segment(out, start_pos=0)
    info = json.loads((path / "ranks" / "rank=0.json").read_text())
    assert info["state"] == "complete"
    cov = info["coverage"]
    assert cov["target"] == "sglang-0.5.23" and cov["sglang_version"] == version
    assert cov["state"] == "full" and cov["fingerprint_known"]
    assert set(cov["hooks"]) == set(targets.HOOKS)
    assert ledger(path) == {"full": 0, "swa": 0}


def test_partial_coverage_ends_partial(tmp_path, monkeypatch):
    importlib.import_module("sglang.srt.mem_cache.unified_radix_cache").UnifiedRadixCache  # imported before recording

    with recording(tmp_path / "t") as path:
        cov = hooks_pkg.coverage()
        rec = tracer.active()
        rec.info["coverage"] = dict(cov, state="partial", trace_state="partial")
    info = json.loads((path / "ranks" / "rank=0.json").read_text())
    assert info["state"] == "partial"
