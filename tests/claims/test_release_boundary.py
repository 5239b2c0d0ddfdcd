"""Claim 5 (sgl-project/sglang#29860): with page_size > W the pre-fix release boundary (W + ps cut
back to W) leaves an all-tombstone leaf (identity broken / SWA leak), and max(W, ps) does not.

On the real sglang 0.5.23 classes this does NOT reproduce: with the boundary patch
(``swa_release_boundary=window_plus_page_cut_to_window``: ``free_swa_out_of_window_slots`` called
with ``supports_prefix_sharing=False``, i.e. frees up to pre_len - W) the occupancy identity holds
at every ``stats`` row of the SWA pool, nothing stays held or protected at idle, every request
finishes and the prefix hits are the same; the pre-fix boundary only releases more SWA (the
0.5.23 insert path splits and recovers tombstoned leaves, see docs/claims.md). The test asserts
what happens, so a change of that behaviour (a leak appearing) fails it.

Scenario (``scenarios.boundary_rows``): ps=64, W=32, chunk 256, SWA pool 2048; 12 requests over
6 shared 640-token prompts with 129..300 output tokens. Measured: released out-of-window SWA
8960 (pre-fix) vs 8576 tokens, peak SWA used 1728 vs 1984, identity breaks 0 and 0.
"""

from __future__ import annotations

import pytest

from tests.claims import scenarios as sc

pytestmark = pytest.mark.sglang


def test_page_larger_than_window_boundary_keeps_identity_on_real_code(tmp_path):
    w = sc.write(tmp_path, "w", sc.boundary_rows())
    runs = {p: tmp_path / p for p in ("max_window_page", "window_plus_page_cut_to_window")}
    summ = {p: sc.replay(w, run, sc.BOUNDARY_SETS, swa_release_boundary=p) for p, run in runs.items()}
    assert summ["window_plus_page_cut_to_window"].patches == ["swa_release_boundary=window_plus_page_cut_to_window"]
    assert summ["max_window_page"].patches == []

    for p, run in runs.items():
        st = sc.stats(run)
        assert st.height >= 50
        assert sc.identity_breaks(run).height == 0, p  # no broken identity at any row
        end = st.row(-1, named=True)
        assert end["held"] == 0 and end["protected"] == 0, (p, end)  # no SWA leak at idle
        assert summ[p].finished == 12 and summ[p].aborted == 0
        assert summ[p].swa_released_tokens > 0  # the out-of-window release did run
    pre, fix = summ["window_plus_page_cut_to_window"], summ["max_window_page"]
    # same hits; the pre-fix boundary releases more (it keeps W, not ceil(max(W, ps)) = 64)
    assert pre.prefix_hit_ratio == pytest.approx(fix.prefix_hit_ratio, abs=1e-9)
    assert pre.swa_released_tokens > fix.swa_released_tokens


@pytest.mark.slow
def test_with_the_pre_22470_insert_the_pre_fix_boundary_leaves_all_tombstone_leaves(tmp_path):
    """The claim as stated holds once 0.5.23's second guard is reverted too: with the planted
    pre-#22470 insert (``all_tombstone_leaf_insert``: a span wholly below the SWA frontier is
    inserted as live SWA instead of as a plain tombstone; Python tree core), the pre-fix boundary
    breaks the SWA occupancy identity (the tree counts slots the allocator holds free) while
    max(W, ps) keeps it: its frontier never reaches page_floor(seq_len)."""
    from replay.record import record_workload

    w = sc.write(tmp_path, "w", sc.boundary_rows())
    sets = [f"{k}={v}" for k, v in sc.BOUNDARY_SETS.items()] + ["tree_core=python"]
    breaks = {}
    for boundary in ("max_window_page", "window_plus_page_cut_to_window"):
        out = tmp_path / boundary
        record_workload(w, out, overrides=(*sets, f"swa_release_boundary={boundary}"),
                        incident="all_tombstone_leaf_insert", incident_every=1)
        breaks[boundary] = sc.identity_breaks(out)
    assert breaks["max_window_page"].height == 0
    bad = breaks["window_plus_page_cut_to_window"]
    assert bad.height >= 5
    gap = (bad["available"] + bad["evictable"] + bad["protected"] + bad["held"] - bad["capacity"])
    assert gap.max() >= 64  # at least one whole page counted twice
