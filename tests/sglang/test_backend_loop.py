"""The real-code backend loop: determinism, occupancy identity, exact prefix sharing, aborts."""

from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")

from replay.backends.sglang import SglangBackend, SglangSettings, parse_overrides  # noqa: E402
from tests.sglang.backend_util import blocks, multi_turn_rows, req, workload  # noqa: E402

pytestmark = pytest.mark.sglang

SMALL = SglangSettings(page_size=16, sliding_window_tokens=32, full_pool_tokens=4096, swa_pool_tokens=1024,
                       chunked_prefill_size=256, max_running_requests=8)


class Steps:
    """Observer collecting every step record, finish and the occupancy after each step."""

    def __init__(self):
        self.steps, self.finished, self.occupancy = [], [], []

    def on_arrival(self, wreq, clock_ns):
        pass

    def on_finish(self, wreq, req, clock_ns, reason):
        self.finished.append((wreq.rid, reason, None if req is None else int(req.cached_tokens)))

    def on_step(self, step, backend):
        self.steps.append(dataclasses.replace(step, cpu_ns=0))
        self.occupancy.append({k: v.as_dict() for k, v in backend.occupancy().items()})


def _run(w, settings=SMALL, **kw):
    obs = Steps()
    with SglangBackend(w, settings, observer=obs, check_integrity_every=1, **kw) as be:
        result = be.run()
        assert be.done and not be.waiting and all(r.finished() for r in be.running.reqs)
    return result, obs


def test_identity_every_step_and_deterministic(tmp_path):
    w = workload(tmp_path, multi_turn_rows())
    r1, o1 = _run(w)
    assert r1.num_finished == len(w.requests) and r1.num_aborted == 0
    assert r1.num_prefill_steps > 0 and r1.num_decode_steps > 0
    for occ in o1.occupancy:  # check_integrity ran too; held is computed independently
        for pool, o in occ.items():
            assert o["available"] + o["evictable"] + o["protected"] + o["held"] == o["capacity"], pool
    # at the end nothing is request-private and every row is back
    final = r1.final_occupancy
    assert final["full"]["held"] == final["swa"]["held"] == 0
    assert final["full"]["protected"] == final["swa"]["protected"] == 0
    assert final["req_to_token"]["available"] == SMALL.max_running_requests
    r2, o2 = _run(w)
    assert r2 == r1
    assert o2.steps == o1.steps and o2.finished == o1.finished and o2.occupancy == o1.occupancy


def test_tree_shares_exactly_the_workload_prefix(tmp_path):
    shared = blocks("shared", 10)  # 160 tokens
    rows = [req(0, 0, shared + blocks("a", 6)),
            req(1, 1000, shared + blocks("b", 6)),   # after 0 finished: shares 10 blocks
            req(2, 2000, blocks("other", 16)),        # shares nothing
            req(3, 3000, shared[:5] + blocks("c", 11))]  # shares 5 blocks
    ps16 = dataclasses.replace(SMALL, sliding_window_tokens=0)  # FULL-only: no SWA gating
    _, obs = _run(workload(tmp_path, rows), ps16)
    cached = {rid: c for rid, _, c in obs.finished}
    assert cached == {0: 0, 1: 160, 2: 0, 3: 80}
    # page 64: the match is the shared prefix floored to the page
    ps64 = dataclasses.replace(ps16, page_size=64)
    _, obs = _run(workload(tmp_path, rows, "w64"), ps64)
    assert {rid: c for rid, _, c in obs.finished} == {0: 0, 1: 128, 2: 0, 3: 64}


def test_next_turn_hits_the_decoded_answer(tmp_path):
    """Output tokens are the next turn's prompt tokens, so turn 2 hits turn 1's decoded KV."""
    first = blocks("t1", 8)  # 128 tokens, block aligned
    rows = [req(0, 0, first, out=40, max_new=40, session=7, turn=0),
            req(1, 2000, first + blocks("t2", 6), session=7, turn=1)]
    _, obs = _run(workload(tmp_path, rows), dataclasses.replace(SMALL, sliding_window_tokens=0))
    cached = {rid: c for rid, _, c in obs.finished}
    # turn 0 keeps prompt + 39 decoded tokens (the last sampled one has no KV): 167 -> 160
    assert cached[1] == 160


def test_too_long_and_retract_paths(tmp_path):
    rows = [req(0, 0, blocks("huge", 300))]  # 4800 tokens > full pool of 4096
    rows += [req(i, 10, blocks(("r", i), 16), out=200, max_new=200) for i in range(1, 9)]
    # fits the pool, but prompt + max_new_tokens does not: max_new_tokens is clipped at arrival
    # (Scheduler.init_req_max_new_tokens), so it is admitted and finishes
    rows += [req(20, 20_000, blocks("greedy", 150), out=4, max_new=4000)]
    result, obs = _run(workload(tmp_path, rows), dataclasses.replace(SMALL, full_pool_tokens=3072,
                                                                     chunked_prefill_size=4096))
    reasons = {rid: reason for rid, reason, _ in obs.finished}
    assert reasons[0] == "too_long" and reasons[20] == "finished"
    assert all(reasons[i] == "finished" for i in range(1, 9))
    assert result.num_aborted == 1
    assert result.num_retractions > 0
    assert sum(s.num_retracted for s in obs.steps) == result.num_retractions


def test_settings_parse_and_validate():
    s = parse_overrides(["page_size=64", "host_pool_tokens=1_024", "device_free=sorted_merge",
                         "swa_lru_refresh=full_ancestry"])
    assert (s.page_size, s.host_pool_tokens, s.need_sort, s.resolved_tree_core) == (64, 1024, True, "python")
    with pytest.raises(ValueError, match="valid knobs: swa_lru_refresh, "):
        parse_overrides(["pagesize=3"])
    with pytest.raises(ValueError, match="expected one of lru"):
        parse_overrides(["eviction_policy=random"])
    with pytest.raises(ValueError, match="tree_core=python"):
        parse_overrides(["swa_lru_refresh=full_ancestry", "tree_core=rust"])
    with pytest.raises(ValueError, match="cannot be expressed by the sglang backend; use --backend reference"):
        parse_overrides(["prefix_ownership=eic_release_protected_prefix"])
    with pytest.raises(ValueError, match="expected a finite number"):
        parse_overrides(["swa_full_tokens_ratio=nan"])
    assert SglangSettings(full_pool_tokens=4096, swa_full_tokens_ratio=0.1).swa_tokens == 400
