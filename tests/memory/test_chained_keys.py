"""Chained keys (``RadixTree.chained_keys``, the reference backend's): a node key is compared with
a key at its last page and a partial match is found by bisection. On chained keys the tree does
exactly what page-by-page comparison does: the same matches, inserts, splits and shape."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.memory.radix.match import GrowingKeys, chained_common

from .side_by_side import evict_all, lock_all, unlock_all
from .test_walk_memo_paths import PS, make_tree


class Chain:
    """Chained page keys of token-page sequences: a page's key names its whole prefix (one id per
    distinct prefix, so equal keys are equal prefixes, without collisions)."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}

    def keys(self, pages: list[int]) -> list[int]:
        return [self.ids.setdefault(tuple(pages[: i + 1]), len(self.ids) + 1) for i in range(len(pages))]


@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.lists(st.integers(0, 3), min_size=1, max_size=40),
       st.integers(0, 5))
def test_bisection_finds_the_shared_pages(a, b, off):
    chain = Chain()
    b = a[:1] + b[1:]  # the walk reached the node through its first page
    ck, key = chain.keys(a), [999_999] * off + chain.keys(b)
    lim = min(len(ck), len(key) - off)
    linear = 0
    while linear < lim and ck[linear] == key[off + linear]:
        linear += 1
    assert chained_common(ck, key, off, lim) == linear


def _shape(tree) -> list:
    out, stack = [], [(tree.root, 0)]
    while stack:
        node, depth = stack.pop()
        out.append((depth, tuple(node.key), node.full is not None, node.swa is not None, node.full_lock))
        stack.extend((c, depth + 1) for c in sorted(node.children.values(), key=lambda c: c.key[0]))
    return out


def _figures(m) -> tuple:
    return (m.device_hit_tokens, m.host_hit_tokens, m.swa_host_hit_tokens, m.full_kv_hit_tokens,
            m.swa_branching_tokens, m.prefix_pages)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_chained_and_page_by_page_trees_agree(seed):
    """Inserts of sequences sharing prefixes of every length (so nodes split anywhere), matches
    with and without limits (memoized and plain keys), evictions and locks, on two trees that
    differ only in ``chained_keys``: same results and the same tree after every operation."""
    rng = random.Random(seed)
    chain = Chain()
    trees = [make_tree(pages=64), make_tree(pages=64)]
    trees[0].chained_keys = True
    stems = [[rng.randrange(3) for _ in range(12)] for _ in range(3)]
    locks: list[list] = [[], []]
    for _step in range(120):
        stem = stems[rng.randrange(len(stems))]
        cut = rng.randint(1, len(stem))
        pages = stem[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 6))]
        key = chain.keys(pages)
        op = rng.random()
        if op < 0.4:
            got = []
            for tree in trees:
                need = len(key) + 2
                if tree.pools.full.available_pages() < need or tree.pools.swa.available_pages() < need:
                    tree.evict(full_tokens=need * PS, swa_tokens=need * PS)
                if tree.pools.full.available_pages() >= len(key) and tree.pools.swa.available_pages() >= len(key):
                    fresh = tree.pools.alloc_extend_pages([0], [len(key) * PS])[0]
                    r = tree.insert(key, fresh)
                    got.append((r.prefix_tokens, r.swa_branch_inserted))
                else:
                    got.append(None)
            assert got[0] == got[1]
        elif op < 0.75:
            limit = rng.choice([None, rng.randint(0, len(key))])
            memo = rng.random() < 0.5
            got = [_figures(tree.match(GrowingKeys(key) if memo else list(key), limit)) for tree in trees]
            assert got[0] == got[1]
        elif op < 0.85:
            evict_all(trees, rng.randint(1, 8) * PS)
        elif op < 0.95:
            lock_all(trees, locks, key)
        else:
            unlock_all(trees, locks)
        for tree in trees:
            tree.check_integrity()
        assert _shape(trees[0]) == _shape(trees[1])


def _nodes(tree) -> list:
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _stamps(tree) -> list:
    out, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        out.append((tuple(node.key), node.last_access, node.priority, node.full_lock, node in tree.device_leaves))
        stack.extend(sorted(node.children.values(), key=lambda c: c.key[0]))
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32))
def test_an_insert_from_the_requests_own_node_is_the_walk(seed):
    """Chunked requests insert chunk after chunk from the node their lock holds (``owned``), on
    one tree, and from the root on the other, with other requests' inserts, matches (splits of
    the owned path) and evictions between: same results, shapes, stamps, priorities and leaf
    sets after every operation."""
    rng = random.Random(seed)
    chain = Chain()
    trees = [make_tree(pages=96), make_tree(pages=96)]
    for tree in trees:
        tree.chained_keys = True
    live: list[dict] = []  # per request: its key, pages per tree, protected pages, locks per tree
    for _step in range(80):
        op = rng.random()
        if op < 0.3 or not live:
            stem = [rng.randrange(2) for _ in range(rng.randint(2, 16))]
            live.append(dict(key=chain.keys(stem), done=0, locks=[None, None], prio=rng.randrange(3)))
        elif op < 0.75:
            req = live[rng.randrange(len(live))]
            key, done = req["key"], req["done"]
            upto = min(len(key), done + rng.randint(1, 5))
            if upto == done:
                continue
            got = []
            for i, tree in enumerate(trees):
                need = upto + 2
                if tree.pools.full.available_pages() < need or tree.pools.swa.available_pages() < need:
                    tree.evict(full_tokens=need * PS, swa_tokens=need * PS)
                if tree.pools.full.available_pages() < upto or tree.pools.swa.available_pages() < upto:
                    got.append(None)
                    continue
                fresh = tree.pools.alloc_extend_pages([0], [upto * PS])[0]
                lock = req["locks"][i]
                owned = lock.node if (lock is not None and i == 0) else None
                if i == 0 and rng.random() < 0.3:  # any node: used only where it is the key's own
                    owned = rng.choice(_nodes(tree))
                r = tree.insert(key, fresh, prev_prefix_tokens=done * PS, inserted_tokens=done * PS,
                                priority=req["prio"], num_pages=upto, owned=owned)
                new = tree.lock(r.last_node)
                if lock is not None:
                    tree.unlock(lock)
                req["locks"][i] = new
                got.append((r.prefix_tokens, r.last_node is not None))
            assert got[0] == got[1]
            if got[0] is not None:
                req["done"] = upto
        elif op < 0.85:
            req = live[rng.randrange(len(live))]
            cut = rng.randint(1, len(req["key"]))
            for tree in trees:
                tree.match(list(req["key"][:cut]) + chain.keys([9, 9, 9])[:1])  # may split the owned path
        elif op < 0.92:
            n = rng.randint(1, 8) * PS
            for tree in trees:
                tree.evict(full_tokens=n, swa_tokens=n)
        else:
            req = live.pop(rng.randrange(len(live)))
            for tree, lock in zip(trees, req["locks"]):
                if lock is not None:
                    tree.unlock(lock)
        for tree in trees:
            tree.check_integrity()
        assert _shape(trees[0]) == _shape(trees[1]) and _stamps(trees[0]) == _stamps(trees[1])
