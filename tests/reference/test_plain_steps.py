"""A figures-only stretch runs its plain steps (no arrival due, no refresh and no budget check of
the refused head; their out-of-window releases included) in one tight loop
(``CoalesceMixin._plain_steps``): its pool
samples are the traced run's ``stats`` rows, sample for sample (clock and used tokens, pool by
pool), and the run's counters and clock are the traced run's, on bundled workloads under several
presets and page sizes; with a host pool the stretch samples through the sink's emits as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.backends.base import FIGURES
from replay.backends.reference.run import record_run, settings_from_knobs
from replay.backends.reference.scheduler import ReferenceBackend
from replay.runs.replay import resolve_settings
from replay.workloads import read_workload
from tests.reference.rows import trace_rows

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"


def _runs(name: str, policy: str, sets: list, tmp_path: Path, monkeypatch, max_requests: int = 120):
    values, _ = resolve_settings(WORKLOADS / name, policy, sets, "reference")
    wl = read_workload(WORKLOADS / name)
    wl.__dict__["requests"] = wl.requests[:max_requests]
    settings = settings_from_knobs(values)
    traced = record_run(wl, settings, tmp_path / "traced")
    plain = [0, 0]
    leave = ReferenceBackend.__exit__

    def count(self, *exc):  # the plain steps (and release steps among them) the figures-only backend ran
        plain[0] += self.plain_steps
        plain[1] += self.plain_releases
        return leave(self, *exc)

    monkeypatch.setattr(ReferenceBackend, "__exit__", count)
    bare = record_run(wl, settings, tmp_path / "bare", detail=FIGURES)
    return traced, bare, trace_rows(tmp_path / "traced"), tuple(plain)


@pytest.mark.parametrize(("name", "policy", "sets"), [
    ("mixed", "swa-fixes", []),
    ("multi_turn", "baseline", ["page_size=16"]),
    ("long_context", "swa-fixes", ["page_size=1"]),
    ("shared_prefix", "eic", ["page_size=8"]),
    ("agentic", "swa-fixes", ["page_size=64", "full_pool_tokens=120000", "swa_pool_tokens=12000"]),
])
def test_plain_steps_sample_what_the_traced_run_writes(name, policy, sets, tmp_path, monkeypatch):
    traced, bare, rows, (plain, releases) = _runs(name, policy, sets, tmp_path, monkeypatch)
    assert plain > 0, "no plain step ran: the comparison says nothing of them"
    if policy == "swa-fixes":  # out-of-window releases on: the plain loop runs some itself
        assert releases > 0, "no plain step released: the comparison says nothing of them"
    want: dict[int, list] = {}
    for r in rows["stats"]:
        want.setdefault(r["pool"], []).append((r["ts_ns"], r["capacity"] - r["available"]))
    got = {name: list(zip(ts, used)) for name, (ts, used, _) in bare.figures.series().items()}
    assert sorted(got) == sorted(want)
    for pool in want:
        assert got[pool] == want[pool], f"{pool}: the samples differ"
    a, b = traced.result, bare.result
    assert (a.num_steps, a.num_decode_steps, a.decode_tokens, a.clock_ns, a.num_finished) == \
           (b.num_steps, b.num_decode_steps, b.decode_tokens, b.clock_ns, b.num_finished)


def test_a_host_pool_keeps_the_sinks_emits(tmp_path, monkeypatch):
    """With HiCache the stretch samples every pool through the emits (no plain steps)."""
    traced, bare, rows, (plain, _) = _runs("agentic", "recorded", ["host_pool_tokens=300000", "page_size=32"],
                                           tmp_path, monkeypatch)
    assert plain == 0
    assert sum(len(ts) for ts, _ in bare.figures.samples.values()) == len(rows["stats"])
