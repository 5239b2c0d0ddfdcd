"""``kvtrace diff`` aligns steps by their position, not by ``forward_ct``.

sglang's own ``Scheduler`` numbers a step by its count of batches run, so an idle iteration's row
repeats the number of the batch before it; the mirror and the reference number every step. The
same trajectory numbered both ways must diff as identical (differential cases ``s1`` and ``s10``
parted only by this), and admit/retract/evict/stats rows must land on the step they belong to.
"""

from __future__ import annotations

from tests.analysis.conftest import write_trace


def _rows(real_numbering: bool, *, idle_full_used: int = 9) -> dict[str, list[dict]]:
    """decode, decode, [retract rid 3] idle, [admit rid 4] prefill, as one or the other numbers it."""
    seq = iter(range(1, 1000))
    sched, stats, cache = [], [], []

    def step(fct, mode, bs, nt, full_used):
        sched.append(dict(seq=next(seq), kind="step", forward_ct=fct, mode=mode, batch_size=bs, num_tokens=nt))
        stats.append(dict(seq=next(seq), forward_ct=fct, pool="full", capacity=24, available=24 - full_used))

    step(1, "decode", 1, 1, 23)
    step(2, "decode", 1, 1, 24)
    # the idle iteration: retract_decode aborts rid 3 (its row carries the step counter before it)
    sched.append(dict(seq=next(seq), kind="retract", forward_ct=2, rid=3, prefix_len=6, extend_len=14))
    cache.append(dict(seq=next(seq), op="evict", full_tokens=1))
    step(2 if real_numbering else 3, "idle", 0, 0, idle_full_used)
    before = 2 if real_numbering else 3
    sched.append(dict(seq=next(seq), kind="admit", forward_ct=before, rid=4, extend_len=5, chunk_requested=5,
                      chunk_admitted=5, verdict="admitted", rem_total=3, rem_swa=9, swa_needed=9))
    step(before + 1, "prefill", 1, 5, 14)
    return {"sched": sched, "stats": stats, "cache": cache}


def test_idle_step_numbered_like_the_real_scheduler_diffs_identical(tmp_path):
    from replay.runs.diff import diff_runs, sched_rows, trajectory

    a = write_trace(tmp_path / "mirror", _rows(False), page_size=1)
    b = write_trace(tmp_path / "real", _rows(True), page_size=1)
    d = diff_runs(a, b)
    assert d.identical and d.steps_a == d.steps_b == 4, d.text()
    t = trajectory(b)
    assert t["step"].to_list() == [1, 2, 3, 4]
    assert t["forward_ct"].to_list() == [1, 2, 2, 3]
    assert t["mode"].to_list() == ["decode", "decode", "idle", "prefill"]
    assert t["full_used"].to_list() == [23, 24, 9, 14]
    assert t["retracted"].to_list() == ["", "", "3", ""]
    assert t["evicted_full"].to_list() == [0, 0, 1, 0]
    assert t["admitted"].to_list() == ["", "", "", "4:5"]
    assert sched_rows(b, "admit")["step"].to_list() == [4]
    assert sched_rows(b, "retract")["step"].to_list() == [3]


def test_a_difference_at_the_idle_step_is_reported_there_with_both_numbers(tmp_path):
    from replay.runs.diff import diff_runs

    a = write_trace(tmp_path / "mirror", _rows(False), page_size=1)
    b = write_trace(tmp_path / "real", _rows(True, idle_full_used=10), page_size=1)
    d = diff_runs(a, b, context=1)
    assert d.first_step == 3 and [m.metric for m in d.metrics] == ["full_used"]
    row = next(r for r in d.context if r["step"] == 3)
    assert (row["a"]["forward_ct"], row["b"]["forward_ct"]) == (3, 2)
    assert "forward_ct=2" in d.text()
