"""Analyses keep steps apart by their place in the trace when ``forward_ct`` repeats.

sglang's own ``Scheduler`` numbers a step by its count of batches run, so an idle iteration's
step row repeats the ``forward_ct`` of the batch step before it (traces of live servers and of
``scheduler=real`` replays).
"""

from __future__ import annotations

import pytest

from tests.analysis.conftest import write_trace


def _rows():
    seq = iter(range(1, 1000))
    pool, sched = [], []

    def op(ts, name, n, dur):
        pool.append(dict(ts_ns=ts, seq=next(seq), pool="host_full", op=name, num_slots=n, num_pages=n // 16,
                         dur_ns=dur))

    def step(ts, fct, mode, step_ns, bs):
        sched.append(dict(ts_ns=ts, seq=next(seq), kind="step", forward_ct=fct, mode=mode, batch_size=bs,
                          step_ns=step_ns))

    op(100, "alloc", 32, 1000)
    op(110, "alloc", 16, 500)
    step(200, 1, "prefill", 10_000, 2)  # batch step 1
    op(300, "free", 16, 4000)
    step(400, 1, "idle", 8_000, 0)  # idle: repeats forward_ct 1
    op(500, "alloc", 16, 700)
    step(600, 2, "decode", 7_000, 1)
    step(700, 2, "idle", 5_000, 0)  # idle, no ops
    op(800, "free", 16, 300)  # after the last step row: no step
    return {"pool": pool, "sched": sched}


def test_allocator_cpu_per_step_by_position(tmp_path):
    from replay.analysis import host_allocator_cpu

    tr = write_trace(tmp_path / "t", _rows())
    steps = host_allocator_cpu(tr).per_step.collect()
    assert steps.columns == ["forward_ct", "ts_ns", "step_ns", "alloc_cpu_ns", "ops", "share_of_step"]
    assert steps.select("forward_ct", "ts_ns", "alloc_cpu_ns", "ops").rows() == [
        (1, 200, 1500, 2), (1, 400, 4000, 1), (2, 600, 700, 1), (2, 700, 0, 0)]
    assert steps["share_of_step"].to_list() == pytest.approx([0.15, 0.5, 0.1, 0.0])
    # nothing counted twice: the steps' ops are all the ops before the last step row
    assert steps["alloc_cpu_ns"].sum() == 1000 + 500 + 4000 + 700
