"""The radix tree's walk memo (``GrowingKeys.walks``, valid while ``RadixTree.version`` is
unchanged) is exact: reference runs with it and without it write the same rows, row for row, on
the 20 differential cases' workloads and settings and on the bundled workloads, under the
presets baseline, swa-fixes and eic."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.memory.radix.tree import RadixTree
from tests.differential.cases import CASES, write_case_workload
from tests.reference.rows import first_difference, reference_rows

POLICIES = ("baseline", "swa-fixes", "eic")
WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"
BUNDLED = ("agentic", "long_context", "mixed", "multi_turn", "shared_prefix")


def _both(monkeypatch, tmp_path, workload, policy, sets=(), max_requests=None):
    on = reference_rows(workload, tmp_path / "on", policy, sets, max_requests)
    monkeypatch.setattr(RadixTree, "walk_memo", False)
    off = reference_rows(workload, tmp_path / "off", policy, sets, max_requests)
    return on, off


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_walk_memo_exact_on_differential_cases(case, policy, tmp_path, monkeypatch):
    write_case_workload(case, tmp_path / "wl")
    on, off = _both(monkeypatch, tmp_path, tmp_path / "wl", policy, case.sets())
    assert on["sched"], "the run wrote no step rows"
    assert first_difference(on, off) is None, first_difference(on, off)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", BUNDLED)
def test_walk_memo_exact_on_bundled_workloads(name, policy, tmp_path, monkeypatch):
    # the first 120 arrivals of each bundled workload (all of agentic and long_context)
    on, off = _both(monkeypatch, tmp_path, WORKLOADS / name, policy, max_requests=120)
    assert on["sched"], "the run wrote no step rows"
    assert first_difference(on, off) is None, first_difference(on, off)
