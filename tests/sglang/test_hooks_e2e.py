"""End to end: the real-code backend runs a tiny multi-turn workload with the hooks recording;
every family but ``drops`` is filled from real code, with zero drops and both identities."""

from __future__ import annotations

import pytest

from tests.sglang.backend_util import multi_turn_rows, workload
from tests.sglang.hooks_fixtures import recording
from tests.sglang.hooks_util import identity_mismatches, ledger_mismatches, rows
from replay.trace import open_trace

import tracer.sglang as hooks  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("hicache", [False, True], ids=["device", "hicache"])
def test_backend_run_fills_every_family(tmp_path, hicache):
    from replay.backends.sglang import SglangSettings, run_backend

    wl = workload(tmp_path, multi_turn_rows(num_sessions=4, turns=3))
    settings = SglangSettings(page_size=16, sliding_window_tokens=32, full_pool_tokens=2048,
                              swa_pool_tokens=512, chunked_prefill_size=256,
                              max_running_requests=4, host_pool_tokens=4096 if hicache else 0)
    with recording(tmp_path / "t") as path:
        result = run_backend(wl, settings)
        assert hooks.failures == {}
    assert result.num_finished == 12
    tr = open_trace(path)
    counts = {f: tr.rows(f) for f in ("request", "sched", "cache", "pool", "stats", "drops")}
    assert all(counts[f] > 0 for f in counts if f != "drops"), counts
    assert counts["drops"] == 0 and tr.num_dropped == 0
    req = rows(path, "request")
    assert sum(r["event"] == "arrival" for r in req) == 12
    assert sum(r["event"] == "finish" for r in req) == 12
    arrivals = [r for r in req if r["event"] == "arrival"]
    assert all(len(r["page_hashes"]) == r["input_len"] // 16 for r in arrivals)
    sched = rows(path, "sched")
    assert {r["kind"] for r in sched} >= {"step", "admit"}
    assert {r["verdict"] for r in sched if r["kind"] == "admit"} >= {"admitted"}
    cache_ops = {r["op"] for r in rows(path, "cache")}
    assert cache_ops >= {"match", "insert", "lock", "unlock", "release", "swa_release"}
    pools = {r["pool"] for r in rows(path, "pool")}
    assert pools >= {"full", "swa", "req_to_token"}
    if hicache:
        assert pools >= {"host_full", "host_swa"} and "backup" in cache_ops
    for check in (ledger_mismatches, identity_mismatches):
        n, bad = check(path)
        assert n > 0 and not bad, bad[:5]
