"""HiCache: write-through/back, demotion, host hits, load-back and host eviction."""

from __future__ import annotations

from .conftest import seq
from .test_model import run_prefill


def hi(make_model, **kw):
    kw.setdefault("page_size", 2)
    kw.setdefault("full_pool_tokens", 64)
    kw.setdefault("host_pool_tokens", 64)
    return make_model(**kw)


def test_write_through_backs_up_a_new_leaf_at_threshold_one(make_model):
    model = hi(make_model)
    run_prefill(model, "r", seq(1, 4), 8)
    model.release("r")
    snap = model.snapshot()
    assert snap["host_full"].evictable == 8 and snap["host_full"].available == 56


def test_write_through_selective_waits_for_the_second_hit(make_model):
    model = hi(make_model, hicache_write_policy="write_through_selective")
    a = seq(1, 4)
    run_prefill(model, "r1", a, 8)
    model.release("r1")
    assert model.snapshot()["host_full"].evictable == 0
    run_prefill(model, "r2", a + seq(2, 1), 10)
    model.release("r2")  # walks the cached node again: hit count 2
    assert model.snapshot()["host_full"].evictable == 8


def test_eviction_demotes_and_load_back_restores(make_model):
    model = hi(make_model, load_back_threshold_tokens=1)
    a = seq(1, 4)
    run_prefill(model, "r1", a, 8)
    model.release("r1")
    res = model.evict(full_tokens=8)
    assert (res.num_demoted_nodes, res.full_tokens, res.num_deleted_nodes) == (1, 8, 0)
    snap = model.snapshot()
    assert (snap["full"].available, snap["full"].evictable, snap["host_full"].evictable) == (64, 0, 8)
    hashes = a + seq(2, 1)
    m = model.match(hashes, max_tokens=9)
    assert (m.device_hit_tokens, m.host_hit_tokens) == (0, 8)
    model.admit("r2", hashes, m)
    assert model.load_back("r2") == 8
    r2 = model.request("r2")
    assert (r2.seq_tokens, r2.protected_tokens, len(r2.pages)) == (8, 8, 4)
    assert model.snapshot()["full"].protected == 8
    model.release("r2", checkpoint=False)
    assert model.match(a).device_hit_tokens == 8


def test_load_back_below_threshold_is_skipped(make_model):
    model = hi(make_model, load_back_threshold_tokens=10)
    a = seq(1, 4)
    run_prefill(model, "r1", a, 8)
    model.release("r1")
    model.evict(full_tokens=8)
    model.admit("r2", a + seq(2, 1), model.match(a + seq(2, 1), max_tokens=9))
    assert model.load_back("r2") == 0  # 8 host tokens < 10
    assert model.request("r2").seq_tokens == 0


def test_host_pressure_evicts_host_only_leaves(make_model):
    model = hi(make_model, host_pool_tokens=8)
    a, b = seq(1, 4), seq(2, 4)
    run_prefill(model, "ra", a, 8)
    model.release("ra")
    model.evict(full_tokens=8)  # A is host-only now
    run_prefill(model, "rb", b, 8)
    model.release("rb")  # B's backup needs the whole host pool: A's host leaf goes
    keys = {n.key[0] for n in model.tree._walk()}
    assert keys == {b[0]}
    assert model.snapshot()["host_full"].evictable == 8


def test_write_back_backs_up_only_at_eviction(make_model):
    model = hi(make_model, hicache_write_policy="write_back")
    a = seq(1, 4)
    run_prefill(model, "r", a, 8)
    model.release("r")
    assert model.snapshot()["host_full"].evictable == 0
    res = model.evict(full_tokens=8)
    assert res.num_demoted_nodes == 1
    assert model.snapshot()["host_full"].evictable == 8
    assert model.match(a).host_hit_tokens == 8


def test_write_back_without_host_room_drops_the_leaf(make_model):
    model = hi(make_model, hicache_write_policy="write_back", host_pool_tokens=4)
    run_prefill(model, "r", seq(1, 4), 8)
    model.release("r")
    res = model.evict(full_tokens=8)
    assert (res.num_deleted_nodes, res.num_demoted_nodes) == (1, 0)
    assert model.tree.num_nodes == 0


def test_swa_host_copy_restores_the_window_on_load_back(make_model):
    model = make_model(page_size=2, full_pool_tokens=64, sliding_window_tokens=4,
                       swa_pool_tokens=64, host_pool_tokens=64)
    a = seq(1, 8)
    run_prefill(model, "r1", a, 16)
    model.release("r1")  # P(6 pages) + L(2 pages), both backed up with their SWA
    snap = model.snapshot()
    assert (snap["host_full"].evictable, snap["host_swa"].evictable) == (16, 16)
    res = model.evict(full_tokens=16)
    assert (res.num_demoted_nodes, res.swa_tokens) == (2, 16)
    hashes = a + seq(2, 1)
    m = model.match(hashes, max_tokens=17)
    assert (m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens) == (0, 16, 4)
    model.admit("r2", hashes, m)
    assert model.load_back("r2") == 16
    snap = model.snapshot()
    # FULL came back for both nodes; SWA only for the window (the leaf); P is a tombstone
    assert (snap["full"].protected, snap["swa"].protected) == (16, 4)
    leaf = model.request("r2").lock.node
    assert leaf.swa is not None and leaf.parent.swa is None and leaf.parent.swa_host is not None
    model.release("r2", checkpoint=False)
    assert model.match(a).device_hit_tokens == 16


def test_swa_host_eviction_drops_internal_copies_first(make_model):
    model = make_model(page_size=2, full_pool_tokens=64, sliding_window_tokens=4,
                       swa_pool_tokens=64, host_pool_tokens=64)
    a = seq(1, 8)
    run_prefill(model, "r1", a, 16)
    model.release("r1")  # P(6 pages) + L(2 pages), both backed up with their SWA
    res = model.evict(swa_tokens=1)  # the SWA LRU tail is P: tombstoned, host copy kept
    assert (res.num_tombstoned_nodes, res.swa_tokens) == (1, 12)
    res = model.evict_host(swa_tokens=4)
    # P is internal (FULL still on device): it loses only its SWA host copy
    assert (res.host_swa_tokens, res.num_deleted_nodes) == (12, 0)
    assert model.tree.num_nodes == 2
    # demoted nodes enter the host SWA LRU leaf first, so a host leaf is the next victim
    model.evict(full_tokens=16)
    res = model.evict_host(swa_tokens=4)
    assert (res.num_deleted_nodes, res.host_swa_tokens, res.host_full_tokens) == (1, 4, 4)
