"""Radix tree: match/insert/split/locks/ledgers and the SWA rules, with hand-computed values."""

from __future__ import annotations

import pytest

from replay.memory.allocator import PagedAllocator
from replay.memory.radix import RadixTree
from replay.memory.results import EvictResult, MemoryModelError
from replay.memory.swa_allocator import PlainKVPools, SWAKVPools

from .conftest import seq


def make_tree(ps=2, window=4, full=64, swa=64, **kw):
    if window:
        pools = SWAKVPools(PagedAllocator(full, ps, name="full"), PagedAllocator(swa, ps, name="swa"))
    else:
        pools = PlainKVPools(PagedAllocator(full, ps))
    return RadixTree(pools, ps, window_tokens=window, **kw), pools


def alloc(pools, num_pages):
    return pools.alloc_extend_pages([0], [num_pages * pools.page_size])[0]


def lru_order(tree):
    return [n.key[0] for n in tree.swa_lru]


def test_insert_match_and_split_without_swa():
    tree, pools = make_tree(window=0)
    a = seq(1, 4)
    tree.insert(a, alloc(pools, 4))
    m = tree.match(a)
    assert (m.device_hit_tokens, tree.num_nodes) == (8, 1)
    m = tree.match(a[:2] + [999])
    assert m.device_hit_tokens == 4 and tree.num_nodes == 2  # split at page 2
    assert m.prefix_pages == [1, 2]
    tree.check_integrity()


def test_insert_frees_duplicates_of_the_request():
    tree, pools = make_tree(window=0)
    a = seq(1, 6)
    tree.insert(a[:4], alloc(pools, 4))
    mine = alloc(pools, 6)
    before = pools.full.available_pages()
    res = tree.insert(a, mine)
    assert res.prefix_tokens == 8 and res.num_dup_pages == 4
    assert pools.full.available_pages() == before + 4
    assert tree.path_pages(res.last_node) == [1, 2, 3, 4] + mine[4:]
    tree.check_integrity()


def test_prev_prefix_is_not_freed_again():
    tree, pools = make_tree(window=0)
    a = seq(1, 6)
    pages = alloc(pools, 6)
    tree.insert(a[:4], pages[:4])
    res = tree.insert(a, pages, prev_prefix_tokens=8)
    assert res.num_dup_pages == 0
    tree.check_integrity()


def test_lock_moves_ledger_and_unlock_restores_it():
    tree, pools = make_tree(window=0)
    a = seq(1, 4)
    leaf = tree.insert(a, alloc(pools, 4)).last_node
    lock = tree.lock(leaf)
    assert (tree.full_evictable, tree.full_protected) == (0, 8)
    assert leaf not in tree.device_leaves
    tree.unlock(lock)
    assert (tree.full_evictable, tree.full_protected) == (8, 0)
    assert leaf in tree.device_leaves
    with pytest.raises(MemoryModelError):
        tree.unlock(lock)


def test_swa_lock_covers_one_window_and_survives_a_split_of_its_boundary():
    tree, pools = make_tree(ps=2, window=4)
    a = seq(1, 8)
    leaf = tree.insert(a, alloc(pools, 8)).last_node  # leaf capped at ceil(4/2)=2 pages
    assert len(leaf.key) == 2 and tree.num_nodes == 2
    lock = tree.lock(leaf)
    assert (tree.swa_evictable, tree.swa_protected) == (12, 4)
    tree.match(a[:7])  # splits the leaf (the boundary node) into 1 + 1 pages
    assert tree.num_nodes == 3
    tree.unlock(lock)
    assert (tree.swa_evictable, tree.swa_protected) == (16, 0)
    assert all(n.swa_lock == 0 and n.full_lock == 0 for n in tree._walk())
    tree.check_integrity()


def _tombstone_gap_tree():
    """P (5 pages live) -> T (1 page tombstone) -> L (2 pages live); ps=2, W=5."""
    tree, pools = make_tree(ps=2, window=5)
    a = seq(1, 8)
    tree.insert(a, alloc(pools, 8))  # P(5) + L(3): the leaf is capped at ceil(5/2) = 3 pages
    tree.match(a[:6])  # split L into T(1) + L(2)
    t_node = tree.root.children[a[0]].children[a[5]]
    assert len(t_node.key) == 1
    tree._tombstone(t_node, EvictResult())
    tree._flush()
    return tree, a


def test_match_stops_at_a_tombstone_gap_shorter_than_the_window():
    tree, a = _tombstone_gap_tree()
    m = tree.match(a)
    # the gap is one page (2 tokens < W) but only 4 live tokens follow it (< W = 5)
    assert m.device_hit_tokens == 10
    assert m.full_kv_hit_tokens == 16
    assert m.swa_branching_tokens == 16
    tree.check_integrity()


def test_a_run_from_the_root_counts_as_unbroken():
    tree, pools = make_tree(ps=2, window=64)
    a = seq(1, 3)
    tree.insert(a, alloc(pools, 3))
    assert tree.match(a).device_hit_tokens == 6  # 6 < W, but nothing lies above it


def test_swa_pressure_tombstones_internal_nodes_and_deletes_leaf_full_kv():
    tree, pools = make_tree(ps=2, window=4)
    a = seq(1, 6)
    leaf = tree.insert(a, alloc(pools, 6)).last_node  # P(4) + L(2)
    parent = leaf.parent
    assert lru_order(tree) == [a[4], a[0]]  # the leaf is more recent than its parent
    res = tree.evict(swa_tokens=2)
    assert (res.num_tombstoned_nodes, res.swa_tokens, res.full_tokens) == (1, 8, 0)
    assert parent.swa is None and parent.full is not None
    full_before = pools.full.available_tokens()
    res = tree.evict(swa_tokens=2)
    # the leaf goes through the FULL leaf path: its full KV is deleted too
    assert (res.num_deleted_nodes, res.swa_tokens, res.full_tokens) == (1, 4, 4)
    assert pools.full.available_tokens() == full_before + 4
    # the tombstoned parent keeps its FULL and becomes a device leaf (not deleted)
    assert tree.num_nodes == 1 and parent in tree.device_leaves
    assert tree.match(a).device_hit_tokens == 0  # an all-tombstone path is unusable
    tree.check_integrity()


def test_full_eviction_follows_the_policy_and_deletes_dead_ancestors():
    for policy, first in (("lru", 1), ("mru", 3), ("fifo", 1), ("filo", 3)):
        tree, pools = make_tree(window=0, eviction=policy)
        for tag in (1, 2, 3):
            tree.insert(seq(tag, 2), alloc(pools, 2))
        res = tree.evict(full_tokens=1)
        assert res.num_deleted_nodes == 1
        gone = {1, 2, 3} - {n.key[0] // 1_000_003 for n in tree._walk()}
        assert gone == {first}, policy
        tree.check_integrity()


def test_parents_join_the_heap_when_they_become_leaves():
    tree, pools = make_tree(window=0)
    a = seq(1, 4)
    tree.insert(a[:2], alloc(pools, 2))
    tree.insert(a, alloc(pools, 4))  # 2 nodes on one path
    tree.insert(seq(2, 2), alloc(pools, 2))  # most recent
    res = tree.evict(full_tokens=8)
    assert res.full_tokens == 8 and res.num_deleted_nodes == 2
    assert [n.key[0] for n in tree._walk()] == [seq(2, 1)[0]]


def test_window_aware_refresh_moves_only_in_window_ancestors():
    for mode, expect_front in (("window_aware", 2), ("full_ancestry", 6)):
        tree, pools = make_tree(ps=4, window=4, swa_lru_refresh=mode)
        a = seq(1, 6)
        pages = alloc(pools, 6)
        for k in range(1, 7):  # one node per page
            tree.insert(a[:k], pages[:k], prev_prefix_tokens=(k - 1) * 4)
        tree.insert(seq(2, 1), alloc(pools, 1))
        tree.match(a)
        order = lru_order(tree)
        assert order[:expect_front] == [a[5 - i] for i in range(expect_front)], mode
        if mode == "window_aware":
            assert order[2] == seq(2, 1)[0]  # out-of-window ancestors stay older
        else:
            assert order[-1] == seq(2, 1)[0]
        tree.check_integrity()


def test_insert_over_unlocked_tombstone_adopts_incoming_pages():
    tree, pools = make_tree(ps=2, window=4)
    a = seq(1, 2)
    old = alloc(pools, 2)
    leaf = tree.insert(a, old).last_node
    tree._tombstone(leaf, EvictResult())
    tree._flush()
    new = alloc(pools, 2)
    full_avail = pools.full.available_pages()
    res = tree.insert(a, new)
    assert res.num_dup_pages == 0
    assert leaf.full == new and leaf.swa == pools.translate(new)
    assert pools.full.available_pages() == full_avail + 2  # old full pages freed full-only
    tree.check_integrity()


def test_insert_over_locked_tombstone_keeps_full_and_takes_incoming_swa():
    tree, pools = make_tree(ps=2, window=4)
    a = seq(1, 2)
    old = alloc(pools, 2)
    leaf = tree.insert(a, old).last_node
    tree._tombstone(leaf, EvictResult())
    tree._flush()
    lock = tree.lock(leaf)
    new = alloc(pools, 2)
    new_swa = pools.translate(new)
    tree.insert(a, new)
    assert leaf.full == old and leaf.swa == new_swa
    assert pools.translate(new) == [0, 0] and pools.translate(old) == new_swa
    assert (tree.swa_evictable, tree.swa_protected) == (0, 4)
    tree.unlock(lock)
    tree.check_integrity()


def test_new_leaf_is_clipped_at_the_swa_cursor():
    tree, pools = make_tree(ps=2, window=4)
    a = seq(1, 6)
    pages = alloc(pools, 6)
    pools.free_swa_of(pages[:3])  # the request already released SWA below token 6
    leaf = tree.insert(a, pages, swa_evicted_tokens=6).last_node
    # live part (3 pages) is capped at ceil(4/2) = 2 pages: tomb(3) -> live(1) -> leaf(2)
    live, tomb = leaf.parent, leaf.parent.parent
    assert [len(n.key) for n in (tomb, live, leaf)] == [3, 1, 2]
    assert tomb.swa is None and live.swa is not None and leaf.swa is not None
    assert tree.num_nodes == 3 and tree.swa_evictable == 6
    tree.check_integrity()


def test_full_eviction_cascade_counts_toward_the_swa_request():
    tree, pools = make_tree(ps=2, window=4)
    tree.insert(seq(1, 2), alloc(pools, 2))  # one leaf, 4 tokens live SWA
    tree.insert(seq(2, 2), alloc(pools, 2))
    # FULL walk deletes the LRU leaf (4 full + 4 SWA); the SWA request of 4 is then met
    res = tree.evict(full_tokens=4, swa_tokens=4)
    assert (res.full_tokens, res.swa_tokens, res.num_deleted_nodes) == (4, 4, 1)
    assert tree.num_nodes == 1
    tree.check_integrity()


def _nodes(tree) -> list:
    """Every node's key, pages (full, SWA), recency stamp and priority, children by key."""
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        out.append((tuple(node.key), node.full and tuple(node.full), node.swa and tuple(node.swa),
                    node.last_access, node.priority))
        stack.extend(node.children[k] for k in sorted(node.children))
    return out


@pytest.mark.parametrize("window", [0, 4])
def test_insert_of_a_prefix_by_num_pages_is_the_insert_of_the_copied_prefix(window):
    """``insert(key, pages, num_pages=n)`` (what a checkpoint passes: the request's whole lists)
    leaves the tree as ``insert(key[:n], pages[:n])`` does, also where a node's key runs past
    ``n`` (it is split at ``n``, not matched whole), and refuses an ``n`` outside either list."""
    states = []
    for by_count in (False, True):
        tree, pools = make_tree(window=window)
        first = seq(1, 3)
        tree.insert(first, alloc(pools, 3))
        key, pages = seq(1, 4), alloc(pools, 4)  # runs past the existing node: 4 pages > 3
        res = (tree.insert(key, pages, prev_prefix_tokens=0, num_pages=2) if by_count
               else tree.insert(key[:2], pages[:2], prev_prefix_tokens=0))
        tree.check_integrity()
        states.append((res.prefix_tokens, tree.node_tokens(res.last_node), tree.num_nodes,
                       pools.full.available_pages(), _nodes(tree)))
    assert states[0] == states[1]
    # the 3-page node split after 2 pages (with a window, the new leaf is capped at a window too)
    assert states[1][:3] == ((4, 4, 2) if not window else (4, 2, 3))
    tree, pools = make_tree(window=window)
    for n in (-1, 4):
        with pytest.raises(ValueError, match="outside the key"):
            tree.insert(seq(1, 3), alloc(pools, 3), num_pages=n)
