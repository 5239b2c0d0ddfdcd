"""KVCacheModel request-level semantics with hand-computed expectations."""

from __future__ import annotations

import pytest

from replay.memory import MemoryModelError
from replay.memory.results import EvictResult

from .conftest import seq


def run_prefill(model, rid, hashes, tokens, checkpoint=False):
    m = model.match(hashes, max_tokens=tokens - 1)
    model.admit(rid, hashes, m)
    assert model.alloc_extend(rid, tokens - model.request(rid).seq_tokens)
    if checkpoint:
        model.checkpoint(rid)
    return m


@pytest.mark.parametrize(
    "boundary, hit, swa_evicted",
    [("window_plus_page_cut_to_window", 0, 24), ("max_window_page", 24, 16)],
)
def test_page_larger_than_window_all_tombstone_leaf(make_model, boundary, hit, swa_evicted):
    # ps=8 > W=4; a chunk of 30 tokens is checkpointed: pre_len = 29.
    model = make_model(page_size=8, full_pool_tokens=256, sliding_window_tokens=4,
                       swa_pool_tokens=256, swa_release_boundary=boundary)
    a = seq(1, 4)
    run_prefill(model, "r1", a, 30, checkpoint=True)
    r1 = model.request("r1")
    # pre-fix: 29 - 4 = 25 -> floor 24 = the whole key: the inserted leaf is all-tombstone.
    # fix: 29 - ceil(max(4, 8)) = 21 -> floor 16: one live page stays.
    assert (r1.swa_evicted_tokens, r1.protected_tokens) == (swa_evicted, 24)
    model.release("r1")
    assert model.match(a, max_tokens=31).device_hit_tokens == hit
    if hit == 0:
        # near-leak: 24 full tokens stay cached but unmatchable, and SWA pressure never
        # reaches them (the all-tombstone leaf is not on the SWA LRU)
        res = model.evict(swa_tokens=256)
        assert res.full_tokens == 0
        assert model.snapshot()["full"].evictable == 24


def test_out_of_window_release_boundaries(make_model):
    # ps=4, W=2, pre_len=19: radix fix keeps ceil(max(2,4)) = 4 -> floor(15) = 12;
    # pre-fix keeps W -> floor(17) = 16; chunk cache keeps W -> 16.
    for kind, boundary, expect in (
        ("radix", "max_window_page", 12),
        ("radix", "window_plus_page_cut_to_window", 16),
        ("chunk", "max_window_page", 16),
    ):
        model = make_model(page_size=4, full_pool_tokens=128, sliding_window_tokens=2,
                           swa_pool_tokens=128, cache_kind=kind, swa_release_boundary=boundary)
        run_prefill(model, "r", seq(1, 5), 20)
        assert model.free_swa_out_of_window("r", pre_len=19, interval_tokens=128) == 0
        freed = model.free_swa_out_of_window("r", pre_len=19)
        assert freed == expect and model.request("r").swa_evicted_tokens == expect
        snap = model.snapshot()["swa"]
        assert snap.held == 20 - expect + 0  # 5 pages of 4 tokens minus the freed ones
        model.release("r")


def test_out_of_window_release_never_crosses_the_protected_prefix(make_model):
    model = make_model(page_size=2, full_pool_tokens=128, sliding_window_tokens=4,
                       swa_pool_tokens=128, swa_out_of_window_release="decode_only")
    a = seq(1, 10)
    run_prefill(model, "w", a[:6], 12)
    model.release("w")
    run_prefill(model, "r", a, 20)
    r = model.request("r")
    assert r.protected_tokens == 12
    freed = model.free_swa_out_of_window("r", pre_len=19)
    # threshold 19 - 4 = 15 -> 14; the cursor starts at the protected prefix 12
    assert freed == 2 and r.swa_evicted_tokens == 14
    model.release("r")


def test_checkpoint_moves_the_lock_and_rewrites_the_row(make_model):
    model = make_model(page_size=2, full_pool_tokens=128, sliding_window_tokens=4,
                       swa_pool_tokens=128)
    a = seq(1, 8)
    run_prefill(model, "r", a, 9)
    assert model.checkpoint("r", up_to_tokens=9) == 8
    r = model.request("r")
    # unfinished insert first frees SWA below 8 - ceil(max(4,2)) = 4 (pre_len = 8)
    assert r.swa_evicted_tokens == 4
    assert r.lock.node is not model.tree.root and r.protected_tokens == 8
    snap = model.snapshot()
    assert (snap["full"].protected, snap["full"].held) == (8, 2)
    # tree: tomb(2 pages) + live(2 pages) with a capped leaf of ceil(4/2) = 2 pages
    assert (snap["swa"].protected, snap["swa"].evictable, snap["swa"].held) == (4, 0, 2)
    model.release("r")
    snap = model.snapshot()
    assert snap["full"].held == 0 and snap["swa"].held == 0


def test_concurrent_identical_prompts_free_the_second_copy(make_model):
    model = make_model(page_size=2, full_pool_tokens=128)
    a = seq(1, 4)
    for rid in ("x", "y"):
        run_prefill(model, rid, a, 8)
    model.release("x")
    free_before = model.snapshot()["full"].available
    model.release("y")
    assert model.snapshot()["full"].available == free_before + 8  # all of y's pages were dups
    assert model.snapshot()["full"].evictable == 8


def test_free_group_lags_occupancy_until_end(make_model):
    model = make_model(page_size=2, full_pool_tokens=64, sliding_window_tokens=4,
                       swa_pool_tokens=64)
    run_prefill(model, "r", seq(1, 4), 8)
    model.free_group_begin()
    model.release("r", checkpoint=False)
    snap = model.snapshot()
    assert snap["full"].available == 56 and snap["full"].held == 8  # lags inside the group
    model.free_group_end()
    assert model.snapshot()["full"].available == 64


def test_allocation_failure_takes_nothing_and_make_room_evicts(make_model):
    model = make_model(page_size=4, full_pool_tokens=32)
    run_prefill(model, "a", seq(1, 4), 16)
    model.release("a")
    model.admit("b", seq(2, 6))
    assert not model.alloc_extend("b", 24)  # 16 free, 16 evictable
    assert model.request("b").seq_tokens == 0
    res = model.make_room(full_tokens=24)
    assert res.full_tokens == 16 and model.alloc_extend("b", 24)


def test_retraction_frees_private_kv_without_inserting(make_model):
    model = make_model(page_size=2, full_pool_tokens=64)
    run_prefill(model, "r", seq(1, 4), 8)
    model.release("r", checkpoint=False)
    snap = model.snapshot()["full"]
    assert (snap.available, snap.evictable) == (64, 0)
    assert model.tree.num_nodes == 0


def test_swa_branching_caps_the_first_checkpoint(make_model):
    model = make_model(page_size=2, full_pool_tokens=256, sliding_window_tokens=5,
                       swa_pool_tokens=256)
    a = seq(1, 8)
    run_prefill(model, "r1", a, 16)
    model.release("r1")  # finished insert: P(5 pages) + capped leaf(3 pages), all live
    model.match(a[:6])  # split the leaf: T(1) + L(2)
    t_node = model.tree.root.children[a[0]].children[a[5]]
    model.tree._tombstone(t_node, EvictResult())
    model.tree._flush()
    hashes = a + seq(2, 2)
    m = model.match(hashes, max_tokens=19)
    assert (m.device_hit_tokens, m.full_kv_hit_tokens, m.swa_branching_tokens) == (10, 16, 16)
    model.admit("r3", hashes, m)
    assert model.alloc_extend("r3", 10)
    assert model.checkpoint("r3", up_to_tokens=20) == 16  # capped at the branching point
    r3 = model.request("r3")
    assert r3.swa_branching_tokens is None and t_node.swa is not None
    model.release("r3")
    assert model.match(a).device_hit_tokens == 16


def test_unknown_and_duplicate_requests_are_errors(make_model):
    model = make_model(page_size=2, full_pool_tokens=64)
    with pytest.raises(MemoryModelError):
        model.alloc_extend("nope", 2)
    model.admit("r", seq(1, 2))
    with pytest.raises(MemoryModelError):
        model.admit("r", seq(1, 2))


def test_stale_match_is_redone_at_admit(make_model):
    model = make_model(page_size=2, full_pool_tokens=32)
    a = seq(1, 4)
    run_prefill(model, "w", a, 8)
    model.release("w")
    m = model.match(a)
    assert m.device_hit_tokens == 8
    model.evict(full_tokens=32)  # the matched nodes are gone
    used = model.admit("r", a, m)
    assert used.device_hit_tokens == 0 and model.request("r").pages == []


def test_full_only_tree_splits_the_leaf_at_the_prompt(make_model):
    model = make_model(page_size=2, full_pool_tokens=64, eviction_policy="priority")
    a = seq(1, 8)
    model.admit("r", a, model.match(a, max_tokens=7), prompt_tokens=8)
    assert model.alloc_extend("r", 8)
    for _ in range(8):
        assert model.alloc_decode(["r"])
    model.release("r")
    prompt = model.tree.root.children[a[0]]
    output = prompt.children[a[4]]
    assert (len(prompt.key), prompt.priority, len(output.key), output.priority) == (4, 1, 4, 0)
    # the output part goes first; the prompt stays matchable
    model.evict(full_tokens=8)
    assert model.match(a).device_hit_tokens == 8
