"""Claim 2 (sgl-project/sglang#31681, gated by #32700): shrinking the chunk admits a prompt whose
SWA need never fits the SWA pool; all-or-nothing admission never schedules it.

Scenario (``scenarios.never_fits_rows``): a 2048-token prompt (SWA need ~2064 >= the 512-slot
SWA pool, W=32, ps=16, chunk 4096) at t=0 and eight 64-token prompts.
Measured: shrink_never_fits finishes 9/9 (the long prompt in shrunk chunks, SWA peak 496 <= 512);
all_or_nothing finishes 8/9 and aborts the long prompt as unschedulable.
"""

from __future__ import annotations

import pytest

from tests.claims import scenarios as sc

pytestmark = pytest.mark.sglang


def test_shrink_admits_a_prompt_that_never_fits(tmp_path):
    import polars as pl

    from replay.trace import open_trace

    w = sc.write(tmp_path, "w", sc.never_fits_rows())
    runs = {p: tmp_path / p for p in ("shrink_never_fits", "all_or_nothing")}
    summ = {p: sc.replay(w, run, sc.NEVER_FITS_SETS, swa_admission=p) for p, run in runs.items()}

    shrink, aon = summ["shrink_never_fits"], summ["all_or_nothing"]
    assert (shrink.finished, shrink.aborted) == (9, 0)
    assert (aon.finished, aon.aborted) == (8, 1)
    ends = {p: {int(r["rid"]): str(r["event"]) for r in sc.requests(run).iter_rows(named=True)}
            for p, run in runs.items()}
    assert ends["shrink_never_fits"][0] == "finish"
    assert ends["all_or_nothing"][0] == "abort"
    assert all(ends[p][i] == "finish" for p in ends for i in range(1, 9))

    # the long prompt ran in chunks cut below what it asked for, and SWA never overflowed
    admits = (open_trace(runs["shrink_never_fits"]).lazy("sched")
              .filter((pl.col("kind") == "admit") & (pl.col("rid") >= 0)).collect())
    assert admits.filter(pl.col("chunk_admitted") < pl.col("chunk_requested")).height >= 2
    assert shrink.peak_swa_used <= sc.NEVER_FITS_SETS["swa_pool_tokens"]
    for run in runs.values():
        assert sc.identity_breaks(run).height == 0
