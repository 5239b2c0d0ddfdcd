"""Capacity curve: exact stack distances on a hand-built workload; refusals for SWA/other policies."""

from __future__ import annotations

import pytest

from replay.analysis import capacity_curve
from tests.analysis.conftest import S, write_trace


def _workload(tmp_path, prompts):
    rows = [dict(ts_ns=i * S, seq=i + 1, event="arrival", rid=i, input_len=33, output_len=0,
                 page_hashes=p) for i, p in enumerate(prompts)]
    return write_trace(tmp_path / "wl", {"request": rows})


def test_stack_distances_exact(tmp_path):
    # A, B, A: at A's second match, 2 pages (B's) were touched since A; A's second page also has
    # its own root newer than it (leaf-first refresh): distances 2 and 3.
    wl = _workload(tmp_path, [[1, 2], [3, 4], [1, 2]])
    c = capacity_curve(wl)
    assert c.prompt_tokens == 99 and c.distinct_pages == 4 and c.requests == 3
    assert c.stack_pages[:2].tolist() == [2, 3]
    assert [c.at(k * 16) for k in (2, 3, 4)] == [0.0, 16 / 99, 32 / 99]
    assert c.capacity_for(32 / 99) == 64 and c.capacity_for(0.9) is None


def test_hits_stop_at_the_first_miss_and_keep_one_token(tmp_path):
    # the third request shares only the root page; input_len 33 leaves 2 usable pages
    wl = _workload(tmp_path, [[1, 2], [1, 9], [1, 2]])
    c = capacity_curve(wl)
    assert c.at(10 * 16) == pytest.approx(3 * 16 / 99)  # r1: root; r2: root + page 2


def test_curve_is_monotone_on_bundled_workload():
    c = capacity_curve("data/workloads/shared_prefix")
    assert (c.hit_ratio[1:] >= c.hit_ratio[:-1]).all()
    assert 0 < c.hit_ratio[-1] <= 1


def test_refuses_swa_and_non_lru(tmp_path):
    wl = _workload(tmp_path, [[1]])
    with pytest.raises(ValueError, match="sweep"):
        capacity_curve(wl, pool="swa")
    with pytest.raises(ValueError, match="inclusion"):
        capacity_curve(wl, policy="lfu")
