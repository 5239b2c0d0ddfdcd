"""Chunk cache (no sharing) and the EIC-style cache (tree owns FULL only)."""

from __future__ import annotations

from .conftest import seq
from .test_model import run_prefill


def test_chunk_cache_never_shares(make_model):
    model = make_model(page_size=2, full_pool_tokens=64, sliding_window_tokens=4,
                       swa_pool_tokens=64, cache_kind="chunk")
    a = seq(1, 4)
    run_prefill(model, "r1", a, 8)
    assert model.checkpoint("r1") == 0
    model.release("r1")
    assert model.match(a).device_hit_tokens == 0
    snap = model.snapshot()
    assert snap["full"].available == 64 and snap["swa"].available == 64
    assert model.evict(full_tokens=8).full_tokens == 0


def eic(make_model):
    return make_model(page_size=2, full_pool_tokens=64, sliding_window_tokens=4,
                      swa_pool_tokens=64, cache_kind="eic")


def test_eic_tree_pins_swa_without_a_ledger(make_model):
    model = eic(make_model)
    run_prefill(model, "r1", seq(1, 8), 16)
    model.release("r1")
    snap = model.snapshot()
    assert (snap["full"].evictable, snap["swa"].evictable, snap["swa"].protected) == (16, 0, 0)
    assert snap["swa"].held == 16  # tree-pinned SWA shows up as held
    res = model.evict(full_tokens=16)
    assert res.full_tokens == 16 and model.snapshot()["swa"].available == 64


def test_eic_releases_below_the_protected_prefix_and_restores_on_reuse(make_model):
    model = eic(make_model)
    a = seq(1, 8)
    run_prefill(model, "r1", a, 16)
    model.release("r1")
    run_prefill(model, "r2", a + seq(2, 1), 18)
    r2 = model.request("r2")
    assert r2.protected_tokens == 16
    # dead_lo is 0 under EIC: 17 - 4 = 13 -> 12 tokens of the tree-owned prefix lose SWA
    assert model.free_swa_out_of_window("r2", pre_len=17) == 12
    assert r2.swa_evicted_tokens == 12
    model.release("r2")
    hashes = a[:6] + seq(3, 1)
    m = model.match(hashes, max_tokens=13)
    assert (m.device_hit_tokens, m.swa_host_hit_tokens) == (12, 4)
    model.admit("r3", hashes, m)
    assert model.load_back("r3") == 4
    assert model.pools.translate(model.request("r3").pages[4:6]) != [0, 0]
    model.release("r3", checkpoint=False)


def test_eic_swa_shortfall_evicts_full_leaves(make_model):
    model = eic(make_model)
    run_prefill(model, "r1", seq(1, 8), 16)
    model.release("r1")
    res = model.evict(swa_tokens=16)
    assert res.full_tokens == 16 and model.snapshot()["swa"].available == 64
