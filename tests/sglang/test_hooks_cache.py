"""Host pool (HiCache) and UnifiedRadixCache hooks on the real sglang 0.5.23 classes (Rust core)."""

from __future__ import annotations

from array import array

import pytest

from tests.sglang.hooks_fixtures import extend, recording, runtime, used
from tests.sglang.hooks_util import identity_mismatches, ledger, ledger_mismatches, rows

import tracer.sglang as hooks  # noqa: E402

pytestmark = pytest.mark.sglang

SWA16 = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=1024, swa_pool_tokens=512,
             max_running_requests=4)


def _key(tokens):
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", tokens))


def test_host_pools_alloc_free_merge_with_cost(tmp_path):
    with recording(tmp_path / "t") as path, runtime(**SWA16, host_pool_tokens=2048) as rt:
        hp = rt.host_pools
        assert set(hp) == {"full", "swa"}
        full, swa = hp["full"], hp["swa"]
        xs = [full.alloc(64) for _ in range(4)]
        y = swa.alloc(32)
        hooks.sample()
        for x in xs:
            full.free(x)  # lazy: queued as released (counted as available at once)
        swa.free(y)
        hooks.sample()
        rest = full.available_size() - 32
        big = full.alloc(rest)  # longer than the free list: merges the released chunks first
        hooks.sample()
        final = {"host_full": full.size - full.available_size(),
                 "host_swa": swa.size - swa.available_size()}
        assert big is not None
    led = ledger(path)
    assert {k: led[k] for k in final} == final
    ops = [(r["pool"], r["op"]) for r in rows(path, "pool") if r["pool"].startswith("host")]
    assert ops.count(("host_full", "alloc")) == 5 and ops.count(("host_full", "free")) == 4
    assert ops.count(("host_swa", "alloc")) == 1 and ops.count(("host_swa", "free")) == 1
    merges = [r for r in rows(path, "pool") if r["op"] == "merge"]
    assert [m["pool"] for m in merges] == ["host_full"] and merges[0]["num_slots"] == 256
    assert all(r["dur_ns"] > 0 for r in rows(path, "pool") if r["pool"].startswith("host"))
    n, bad = ledger_mismatches(path)
    assert n > 0 and not bad, bad
    assert hooks.failures == {}


def test_radix_insert_match_evict_tombstones_lock(tmp_path):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

    with recording(tmp_path / "t") as path, runtime(**SWA16) as rt:
        tree, a = rt.tree, rt.allocator
        a_vals = extend(a, [0], [128], [-1])
        tree.insert(InsertParams(key=_key(range(1, 129)), value=a_vals.clone()))
        b_vals = extend(a, [0], [96], [-1])  # shares the first 64 tokens with A
        res = tree.insert(InsertParams(key=_key(list(range(1, 65)) + list(range(500, 532))),
                                       value=b_vals.clone()))
        assert res.prefix_len == 64  # the tree freed B's duplicate prefix itself
        hooks.sample()
        m = tree.match_prefix(MatchPrefixParams(key=_key(list(range(1, 129)) + [7])))
        assert m.device_prefix_len == 128
        lock = tree.lock(m.last_device_node)
        hooks.sample()
        tree.unlock(lock)
        tree.evict(EvictParams(num_tokens=0, swa_num_tokens=64))  # SWA pressure: tombstones
        hooks.sample()
        tree.evict(EvictParams(num_tokens=1024))  # everything else
        hooks.sample()
        final = used(a)
    assert final == {"full": 0, "swa": 0} and ledger(path) == final
    cache = rows(path, "cache")
    ops = [r["op"] for r in cache]
    assert ops.count("insert") == 2 and ops.count("match") == 1
    assert ops.count("lock") == 1 and ops.count("unlock") == 1
    inserts = [r for r in cache if r["op"] == "insert"]
    assert [(r["device_hit"], r["full_tokens"]) for r in inserts] == [(0, 128), (64, 32)]
    match = next(r for r in cache if r["op"] == "match")
    assert match["device_hit"] == 128
    lock_row = next(r for r in cache if r["op"] == "lock")
    assert lock_row["full_tokens"] == 128 and lock_row["swa_tokens"] > 0
    evicts = [r for r in cache if r["op"] == "evict"]
    assert len(evicts) == 2
    assert evicts[0]["swa_tokens"] >= 64 and evicts[0]["tombstones"] >= 1
    assert sum(e["full_tokens"] for e in evicts) == 160
    # the tree's duplicate-prefix free and the evictions are pool rows too
    assert sum(r["num_slots"] for r in rows(path, "pool") if r["pool"] == "full" and r["op"] == "free") == 224
    for check in (ledger_mismatches, identity_mismatches):
        n, bad = check(path)
        assert n == 8 and not bad, bad
    assert hooks.failures == {}
