"""``kvtrace doctor`` picks its comparable-load samples by step row, not by ``forward_ct``.

sglang's own ``Scheduler`` numbers a step by its count of batches run, so an idle iteration's
step and stats rows repeat the ``forward_ct`` of the batch step before it. Choosing the drains
(idle samples) by number would pull in the loaded batch step's samples too: here they hide a
leak that grows at every drain (the batch steps' load falls faster than the leak grows).
"""

from __future__ import annotations

from tests.analysis.conftest import S, write_trace

CAP = 4096


def _rows(k: int = 12):
    seq = iter(range(1, 10_000))
    sched, stats = [], []
    for i in range(1, k + 1):
        leak = 16 * i  # slots nobody holds
        for mode, bs, held, prot in (("decode", 4, 100, 2000 - 64 * i), ("idle", 0, 0, 0)):
            ts = (2 * i + (mode == "idle")) * S
            sched.append(dict(ts_ns=ts, seq=next(seq), kind="step", forward_ct=i, mode=mode, batch_size=bs))
            stats.append(dict(ts_ns=ts, seq=next(seq), forward_ct=i, pool="full", capacity=CAP,
                              available=CAP - held - prot - leak, evictable=0, protected=prot, held=held))
    return {"sched": sched, "stats": stats}


def test_drains_sampled_by_step_row(tmp_path):
    import numpy as np

    from replay.diagnosis.columns import load_stats
    from replay.diagnosis.doctor import _samples, _step_of_samples, doctor
    from replay.trace import open_trace

    path = write_trace(tmp_path / "t", _rows())
    tr = open_trace(path)
    st = load_stats(tr, 0)
    step, batch = _step_of_samples(tr, 0, st)
    assert step.tolist() == list(range(24)) and batch.tolist() == [4, 0] * 12
    picked, how = _samples(st, step, batch)
    assert how.startswith("drains") and picked.tolist() == list(range(1, 24, 2))  # the idle steps only
    assert np.all(st.held[np.isin(step, picked)] == 0)
    g = doctor(path).growth["full"]
    assert g["verdict"] == "growing" and g["samples"] == 12 and g["rise_tokens"] == 16 * 11, g
