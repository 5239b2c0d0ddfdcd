"""Capacity curve: exact stack distances on a hand-built workload; refusals for SWA/other policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _stack_pass_quadratic(events, usable):
    """The stack pass restated the plain O(events^2) way (prefix sums recomputed per event)."""
    if not events:
        return np.zeros(0, np.int64)
    allp = np.concatenate([e[2] for e in events]).astype(np.uint64)
    _, dense = np.unique(allp, return_inverse=True)
    offsets = np.cumsum([0] + [len(e[2]) for e in events])
    last = np.full(int(dense.max()) + 1 if len(dense) else 1, -1, np.int64)
    cnt = np.zeros(len(events) + 1, np.int64)
    out = []
    for e, (_, _, pages, ridx) in enumerate(events):
        ids = dense[offsets[e]:offsets[e + 1]]
        prev = last[ids]
        if ridx >= 0 and usable[ridx]:
            p = prev[:usable[ridx]]
            seen = p >= 0
            d = np.full(len(p), np.iinfo(np.int64).max, np.int64)
            if seen.any():
                newer = cnt[:e].sum() - np.cumsum(cnt[:e])[p[seen]]
                d[seen] = newer + np.minimum(np.nonzero(seen)[0], cnt[p[seen]])
            out.append(np.maximum.accumulate(d))
        valid = prev[prev >= 0]
        if len(valid):
            cnt[:e] -= np.bincount(valid, minlength=e)[:e]
        cnt[e] += len(ids)
        last[ids] = e
    return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 30), max_size=12), st.booleans(), st.integers(0, 12)),
                min_size=1, max_size=40))
def test_fenwick_stack_pass_equals_the_quadratic_one(raw):
    from replay.analysis.capacity import _stack_pass

    events = [(k, k, np.asarray(pages, np.uint64), k if is_match else -1)
              for k, (pages, is_match, _) in enumerate(raw)]
    usable = {k: min(len(pages), u) for k, (pages, _, u) in enumerate(raw)}
    got, distinct = _stack_pass(events, usable)
    assert np.array_equal(got, _stack_pass_quadratic(events, usable))
    assert distinct == len({p for pages, _, _ in raw for p in pages})
