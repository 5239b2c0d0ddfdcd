"""The radix tree's walk memo (``GrowingKeys.walks``) is path-local and exact: a remembered walk
is reused while the tree changes off its path, and walked again when a node it read changed
(its key or components, the children entry it followed or found missing), giving what a fresh
walk gives."""

from __future__ import annotations

import random

from replay.memory.allocator import PagedAllocator
from replay.memory.host_pool import HostPool
from replay.memory.radix import RadixTree
from replay.memory.radix.match import GrowingKeys
from replay.memory.results import EvictResult
from replay.memory.swa_allocator import SWAKVPools

from .conftest import seq

PS, WINDOW = 2, 4


def make_tree(hicache: bool = False, pages: int = 64, ps: int = PS, window: int = WINDOW) -> RadixTree:
    pools = SWAKVPools(PagedAllocator(pages * ps, ps, name="full"), PagedAllocator(pages * ps, ps, name="swa"))
    host = {}
    if hicache:
        host = dict(host_full=HostPool(pages * ps, ps, "eager_cat", "host_full"),
                    host_swa=HostPool(pages * ps, ps, "eager_cat", "host_swa"))
    return RadixTree(pools, ps, window_tokens=window, **host)


def put(tree: RadixTree, key: list[int]):
    """Insert ``key`` with fresh pages (the tree frees the duplicates); its last node."""
    pages = tree.pools.alloc_extend_pages([0], [len(key) * PS])[0]
    return tree.insert(key, pages).last_node


def room_for(tree: RadixTree, pages: int, ps: int = PS) -> bool:
    """Evict for ``pages`` pages and two more where either pool is short; whether they fit."""
    full, swa = tree.pools.full, tree.pools.swa
    need = pages + 2
    if full.available_pages() < need or swa.available_pages() < need:
        tree.evict(full_tokens=need * ps, swa_tokens=need * ps)
    return full.available_pages() >= pages and swa.available_pages() >= pages


def shape(result) -> tuple:
    """A walk result with its value lists by content (nodes by identity)."""
    values, best, best_dev, chunks, hit = result
    return [list(v) for v in values], best, best_dev, chunks, hit


def walk(tree: RadixTree, key: GrowingKeys) -> tuple[tuple, bool]:
    """(the memoized walk's result, whether the memo answered it), checked against a fresh walk
    of a plain copy of the key on the same tree."""
    hits = tree.walk_memo_hits
    got = shape(tree._match_walk(key))
    hit = tree.walk_memo_hits > hits
    assert got == shape(tree._match_walk(list(key))), "the memoized walk differs from a fresh one"
    tree.check_integrity()
    return got, hit


def two_branches(hicache: bool = False):
    """A: 8 pages under the root (a 6-page node and, a new leaf being capped at one window, a
    2-page leaf); B: 4 pages under the root with a 4-page child. The walked key is A plus 2
    pages the tree lacks (the walk stops at A's leaf, a node boundary)."""
    tree = make_tree(hicache)
    a_leaf = put(tree, seq(1, 8))
    put(tree, seq(2, 4))
    put(tree, seq(2, 4) + seq(3, 4))
    key = GrowingKeys(seq(1, 8) + seq(9, 2))
    first, hit = walk(tree, key)
    assert not hit and first[4] == 8 and first[1] is a_leaf and len(first[0]) == 2
    assert a_leaf.parent.parent is tree.root
    return tree, key, a_leaf


def test_a_change_off_the_path_keeps_the_memo():
    tree, key, a_leaf = two_branches()
    root_mod = tree.root.mod
    _, hit = walk(tree, key)
    assert hit  # nothing changed at all
    v = tree.version
    b_leaf = put(tree, seq(2, 4) + seq(4, 4))  # a new leaf under B: B's children change, not the root's
    b = b_leaf.parent
    assert tree.version > v and tree.root.mod == root_mod and b.mod > v and b is not tree.root
    _, hit = walk(tree, key)
    assert hit
    tree._tombstone(b, EvictResult())  # B's SWA goes (a component change off the path)
    tree._flush()
    _, hit = walk(tree, key)
    assert hit
    tree.evict_device_leaf(b_leaf, EvictResult())  # B's new leaf deleted: B's children change
    tree._flush()
    assert b_leaf.key[0] not in b.children and tree.root.mod == root_mod
    _, hit = walk(tree, key)
    assert hit and a_leaf.parent.parent is tree.root


def test_a_new_child_where_the_walk_stopped_misses_for_its_page_only():
    tree, key, a_leaf = two_branches()
    put(tree, seq(1, 8) + seq(8, 1))  # a child of A's leaf for another page
    _, hit = walk(tree, key)
    assert hit
    put(tree, seq(1, 8) + seq(9, 1))  # a child of A's leaf for the page the walk looked up
    got, hit = walk(tree, key)
    assert not hit and got[4] == 9  # one page further
    _, hit = walk(tree, key)
    assert hit


def test_a_split_on_the_path_misses():
    tree, key, a_leaf = two_branches()
    tree.match(seq(1, 3) + [999])  # splits A's top node after 3 pages
    got, hit = walk(tree, key)
    assert not hit and len(got[0]) == 3 and got[1] is a_leaf and got[4] == 8


def test_root_children_changes_miss_only_on_the_walked_entry():
    tree, key, _ = two_branches()
    put(tree, seq(5, 2))  # a new root child off the path: the walk read only the root's A entry
    _, hit = walk(tree, key)
    assert hit
    absent = GrowingKeys(seq(6, 3))  # the root has no child for its first page
    got, hit = walk(tree, absent)
    assert not hit and got[4] == 0
    _, hit = walk(tree, absent)
    assert hit
    put(tree, seq(6, 2))  # now it has
    got, hit = walk(tree, absent)
    assert not hit and got[4] == 2
    gone = tree.root.children[seq(5, 1)[0]]
    tree.evict_device_leaf(gone, EvictResult())  # an off-path root child deleted
    tree._flush()
    assert seq(5, 1)[0] not in tree.root.children
    _, hit = walk(tree, key)
    assert hit
    gone = tree.root.children[seq(6, 1)[0]]
    tree.evict_device_leaf(gone, EvictResult())  # the walked root child deleted
    tree._flush()
    got, hit = walk(tree, absent)
    assert not hit and got[4] == 0


def test_a_component_change_on_the_path_misses():
    tree, key, a_leaf = two_branches()
    top = a_leaf.parent  # 6 pages
    tree._tombstone(top, EvictResult())  # the window rule now fails at the leaf's parent
    tree._flush()
    got, hit = walk(tree, key)
    assert not hit and got[2] is a_leaf  # the leaf still holds W tokens of SWA by itself
    tree._tombstone(a_leaf, EvictResult())
    tree._flush()
    got, hit = walk(tree, key)
    assert not hit and got[2] is tree.root and got[4] == 8  # FULL still hits, the device hit is gone
    tree.evict_device_leaf(a_leaf, EvictResult())  # the leaf's FULL goes (deleted: no host copy)
    tree._flush()
    got, hit = walk(tree, key)
    assert not hit and got[4] == 6


def test_host_tier_changes_on_the_path_miss():
    tree, key, a_leaf = two_branches(hicache=True)
    assert a_leaf.full_host is not None  # write-through at the insert (threshold 1)
    tree.evict_host(full_tokens=2 * PS)  # no host leaf (A's leaf still on device): nothing
    _, hit = walk(tree, key)
    assert hit
    tree.evict_device_leaf(a_leaf, EvictResult())  # demoted: host only
    tree._flush()
    got, hit = walk(tree, key)
    assert not hit and a_leaf.full is None and got[1] is a_leaf and got[2] is a_leaf.parent
    _, hit = walk(tree, key)
    assert hit
    assert tree.load_back(a_leaf)  # device FULL (and SWA) back
    got, hit = walk(tree, key)
    assert not hit and got[2] is a_leaf


def test_memo_off_never_hits():
    tree, key, _ = two_branches()
    RadixTree.walk_memo = False
    try:
        _, hit = walk(tree, key)
    finally:
        RadixTree.walk_memo = True
    assert not hit


def test_random_operations_memo_equals_fresh_walks():
    """Inserts, splitting matches, evictions (FULL and SWA, device and host), locks and
    load-backs in random order; after each, every remembered key's walk equals a fresh walk;
    the memo answers a good share of them."""
    rng = random.Random(5)
    tree = make_tree(hicache=True, pages=48)
    stems = [seq(t, 6) for t in range(1, 5)]
    keys = [GrowingKeys() for _ in range(10)]
    locks, hits, walks = [], 0, 0
    for step in range(600):
        op = rng.random()
        stem = stems[rng.randrange(len(stems))]
        tail = [7_000 + rng.randrange(6) for _ in range(rng.randint(0, 4))]
        if op < 0.3:
            need = len(stem) + len(tail)
            if tree.pools.full.available_pages() < need + 2:
                tree.evict(full_tokens=(need + 2) * PS, swa_tokens=(need + 2) * PS)
            if tree.pools.full.available_pages() >= need and tree.pools.swa.available_pages() >= need:
                put(tree, stem[: rng.randint(1, 6)] + tail)
        elif op < 0.45:
            tree.match(stem[: rng.randint(1, 6)] + tail)  # may split
        elif op < 0.55:
            tree.evict(full_tokens=rng.randint(1, 6) * PS)
        elif op < 0.65:
            tree.evict(swa_tokens=rng.randint(1, 6) * PS)
        elif op < 0.7:
            tree.evict_host(full_tokens=rng.randint(1, 4) * PS, swa_tokens=rng.randint(1, 4) * PS)
        elif op < 0.8:
            m = tree.match(stem + tail)
            if rng.random() < 0.5 and m.best_match_node is not tree.root:
                tree.load_back(m.best_match_node)
            elif m.last_device_node is not tree.root:
                locks.append(tree.lock(m.last_device_node))
        elif op < 0.88 and locks:
            tree.unlock(locks.pop(rng.randrange(len(locks))))
        else:
            k = keys[rng.randrange(len(keys))]
            if len(k) < 10:
                k.extend((stem + tail)[len(k): len(k) + rng.randint(1, 3)] or [8_000 + step])
        tree.check_integrity()
        for k in keys:
            if k:
                for n in {len(k), rng.randint(1, len(k))}:
                    before = tree.walk_memo_hits
                    got = shape(tree._match_walk(k, n))
                    hits += tree.walk_memo_hits - before
                    walks += 1
                    assert got == shape(tree._match_walk(list(k[:n]))), f"step {step}: stale memo"
    assert walks > 1000 and hits > walks // 4


def _figures(m) -> tuple:
    return (m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens, m.full_kv_hit_tokens,
            m.swa_branching_tokens, m.last_device_node, m.best_match_node)


def _stamps(tree: RadixTree) -> list:
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        out.append((node, node.last_access))
        stack.extend(node.children.values())
    return out


def test_peek_and_pure_walks_are_pure_reads_of_what_match_and_touch_many_do():
    """``peek`` gives ``match``'s figures without splitting, stamping or reordering anything, and
    None exactly where ``match`` splits a node; memoized walks and walks as pure reads
    (``_match_walk(split=False)``, what the reference backend's refresh window runs) reach the best
    nodes ``touch_many`` reaches, and None where it splits."""
    rng = random.Random(11)
    tree = make_tree(hicache=True, pages=48)
    stems = [seq(t, 8) for t in range(1, 5)]
    peeked = none = memo_ok = memo_none = 0
    for step in range(400):
        stem = stems[rng.randrange(len(stems))]
        key = stem[: rng.randint(1, 8)] + [9_000 + rng.randrange(5) for _ in range(rng.randint(0, 3))]
        op = rng.random()
        if op < 0.35:
            if room_for(tree, len(key)):
                put(tree, key)
        elif op < 0.5:
            tree.evict(full_tokens=rng.randint(1, 4) * PS, swa_tokens=rng.randint(0, 4) * PS)
        elif op < 0.75:
            version, clock, stamps = tree.version, tree.clock, _stamps(tree)
            lru = list(tree.swa_lru)
            limit = rng.choice([None, len(key) - 1])
            p = tree.peek(GrowingKeys(key), limit)
            assert (tree.version, tree.clock) == (version, clock), f"step {step}: peek changed the tree"
            assert _stamps(tree) == stamps and list(tree.swa_lru) == lru
            m = tree.match(list(key), limit)
            if p is None:
                none += 1
                assert tree.version != version, f"step {step}: peek refused a match that splits nothing"
            else:
                peeked += 1
                assert tree.version == version and p.prefix_pages is None
                assert _figures(p) == _figures(m), f"step {step}: peek and match differ"
        else:
            keys = [GrowingKeys(stems[rng.randrange(len(stems))][: rng.randint(1, 8)]) for _ in range(3)]
            version = tree.version
            walks = [tree._match_walk(k, split=False) for k in keys]
            bests = None if None in walks else [w[1] for w in walks]
            assert tree.version == version
            got = tree.touch_many([list(k) for k in keys])
            if bests is None:
                memo_none += 1
                assert tree.version != version, f"step {step}: a pure walk refused touches that split nothing"
            else:
                memo_ok += 1
                assert tree.version == version and all(a is b for a, b in zip(bests, got)) and len(bests) == len(got)
        tree.check_integrity()
    assert peeked > 20 and none > 5 and memo_ok > 20 and memo_none > 2, (peeked, none, memo_ok, memo_none)
