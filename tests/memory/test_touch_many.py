"""``RadixTree.touch_many`` (the waiting-queue prefix refresh in one call) leaves the tree exactly
as the same touches one by one do: every node's stamp, the SWA LRU orders, the leaf heaps' order
and the clock, with splits, evictions, locks and host tiers in between."""

from __future__ import annotations

import random

import pytest

from replay.memory.allocator import PagedAllocator
from replay.memory.host_pool import HostPool
from replay.memory.radix import RadixTree
from replay.memory.radix.match import GrowingKeys
from replay.memory.swa_allocator import SWAKVPools

from .conftest import seq

PS, WINDOW = 2, 4


def make_tree(hicache: bool, window_aware: bool, pages: int = 48) -> RadixTree:
    pools = SWAKVPools(PagedAllocator(pages * PS, PS, name="full"), PagedAllocator(pages * PS, PS, name="swa"))
    host = {}
    if hicache:
        host = dict(host_full=HostPool(pages * PS, PS, "eager_cat", "host_full"),
                    host_swa=HostPool(pages * PS, PS, "eager_cat", "host_swa"))
    return RadixTree(pools, PS, window_tokens=WINDOW,
                     swa_lru_refresh="window_aware" if window_aware else "full_ancestry", **host)


def _lru(lst) -> list[int]:
    out, cur = [], lst.head.lru_next[lst.k]
    while cur is not lst.tail:
        out.append(cur.id)
        cur = cur.lru_next[lst.k]
    return out


def _heap(h) -> list[int]:
    live = [e for e in h.heap if e[-1] in h.members and e[3] == e[-1].heap_ver[h.slot]]
    return [e[2] for e in sorted(live, key=lambda e: e[:3])]


def state(tree: RadixTree) -> tuple:
    """Everything a later decision reads of the recency effects, by node id."""
    nodes, stack = [], [tree.root]
    while stack:
        n = stack.pop()
        nodes.append((n.id, tuple(n.key), n.last_access, n.full is not None, n.swa is not None))
        stack.extend(sorted(n.children.values(), key=lambda c: c.id))
    lrus = tuple(_lru(x) for x in (getattr(tree, "swa_lru", None), getattr(tree, "swa_host_lru", None)) if x)
    return nodes, lrus, _heap(tree.device_heap), _heap(tree.host_heap), tree.clock, tree.version


def put(tree: RadixTree, key: list[int]) -> None:
    pages = tree.pools.alloc_extend_pages([0], [len(key) * PS])[0]
    tree.insert(key, pages)


@pytest.mark.parametrize("hicache", [False, True])
@pytest.mark.parametrize("window_aware", [False, True])
def test_touch_many_equals_touches_one_by_one(hicache, window_aware):
    rng = random.Random(11 + 2 * hicache + window_aware)
    a, b = make_tree(hicache, window_aware), make_tree(hicache, window_aware)
    stems = [seq(t, 6) for t in range(1, 5)]
    # the same keys for both trees, each tree with its own objects (a GrowingKeys memo is per key)
    keys_a = [GrowingKeys() for _ in range(12)]
    keys_b = [GrowingKeys() for _ in range(12)]
    locks, batches = [], 0
    for step in range(500):
        op = rng.random()
        stem = stems[rng.randrange(len(stems))]
        tail = [7_000 + rng.randrange(6) for _ in range(rng.randint(0, 4))]
        for tree, side in ((a, "a"), (b, "b")):
            r = random.Random(step)  # the same choices on both trees
            if op < 0.25:
                need = len(stem) + len(tail)
                if tree.pools.full.available_pages() < need + 2:
                    tree.evict(full_tokens=(need + 2) * PS, swa_tokens=(need + 2) * PS)
                if tree.pools.full.available_pages() >= need and tree.pools.swa.available_pages() >= need:
                    put(tree, stem[: r.randint(1, 6)] + tail)
            elif op < 0.35:
                tree.evict(full_tokens=r.randint(1, 6) * PS)
            elif op < 0.42:
                tree.evict(swa_tokens=r.randint(1, 6) * PS)
            elif op < 0.46 and hicache:
                tree.evict_host(full_tokens=r.randint(1, 4) * PS, swa_tokens=r.randint(1, 4) * PS)
            elif op < 0.55:
                m = tree.match(stem + tail)
                if m.last_device_node is not tree.root and r.random() < 0.7:
                    locks.append((side, tree.lock(m.last_device_node)))
            elif op < 0.62:
                mine = [i for i, (s, _) in enumerate(locks) if s == side]
                if mine:
                    tree.unlock(locks.pop(mine[r.randrange(len(mine))])[1])
            elif op < 0.72:
                ks = keys_a if side == "a" else keys_b
                k = ks[r.randrange(len(ks))]
                if len(k) < 10:
                    k.extend((stem + tail)[len(k): len(k) + r.randint(1, 3)] or [8_000 + step])
            else:  # the refresh: some growing keys (memo) and some plain lists (a split may come)
                picks = [r.randrange(12) for _ in range(r.randint(1, 8))]
                ks = keys_a if side == "a" else keys_b
                batch = [ks[i] if r.random() < 0.7 else list(ks[i]) + [9_000 + r.randrange(3)]
                         for i in picks if len(ks[i])]
                if side == "a":
                    for k in batch:
                        tree.touch(k)
                else:
                    tree.touch_many(batch)
                    batches += 1
        a.check_integrity()
        b.check_integrity()
        assert state(a) == state(b), f"step {step}: touch_many left a different tree"
    assert batches > 100
