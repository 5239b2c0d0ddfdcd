"""An insert's new leaf on an SWA tree is built directly (``InsertMixin._add_swa_leaf``: the
tombstone below the request's SWA-evicted cursor, the SWA part above the leaf's last window, the
leaf) where it used to be added whole and split twice (``_add_leaf`` then ``_populate_swa``). The
two trees agree after every operation in everything a later decision reads: node ids, keys,
pages, stamps, creation times, priorities, hit counts, ledgers, leaf sets, SWA LRU orders, and
the order in which eviction takes the leaves."""

from __future__ import annotations

import random
import types

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.memory.radix import RadixTree

from .side_by_side import evict_all, lock_all, unlock_all
from .test_walk_memo_paths import make_tree, room_for


def _tree(ps: int, window: int, hicache: bool) -> RadixTree:
    return make_tree(hicache, pages=96, ps=ps, window=window)


def _split_twice(self, parent, key, pages, pos, n, ws_pages, priority):
    """The former path: the whole leaf, then ``_populate_swa`` splits it."""
    node = self._add_leaf(parent, key[pos:n], pages[pos:n], priority)
    self._populate_swa(node, pos, ws_pages, cap_leaf=True)
    return node


def _state(tree) -> tuple:
    nodes, stack = [], [tree.root]
    while stack:
        node = stack.pop()
        nodes.append((node.id, node.parent.id if node.parent else None, tuple(node.key), node.full, node.swa,
                      node.full_host, node.swa_host, node.last_access, node.creation_time, node.priority,
                      node.hit_count, node.dev_children, node.full_lock, node.swa_lock))
        stack.extend(sorted(node.children.values(), key=lambda c: c.id))
    ledgers = (tree.full_evictable, tree.full_protected, tree.swa_evictable, tree.swa_protected, tree.num_nodes,
               tree.clock, tree._next_node_id)
    leaves = (sorted(n.id for n in tree.device_leaves), sorted(n.id for n in tree.host_leaves))
    lru = ([n.id for n in tree.swa_lru], [n.id for n in tree.swa_host_lru])
    return nodes, ledgers, leaves, lru


def _victims(tree) -> list[int]:
    """The order eviction takes the device leaves (the heap is emptied: the end of a test)."""
    out = []
    while (node := tree.device_heap.pop()) is not None:
        out.append(node.id)
        tree.device_leaves.discard(node)
    return out


def _run(seed: int) -> int:
    rng = random.Random(seed)
    ps = rng.choice((1, 2, 4))
    window = rng.choice((1, 3, 4, 8, 16))
    hicache = rng.random() < 0.4
    trees = [_tree(ps, window, hicache), _tree(ps, window, hicache)]
    trees[1]._add_swa_leaf = types.MethodType(_split_twice, trees[1])
    stems = [[rng.getrandbits(40) for _ in range(14)] for _ in range(3)]
    locks: list[list] = [[], []]
    built = 0
    for _step in range(90):
        stem = stems[rng.randrange(len(stems))]
        key = stem[: rng.randint(1, 14)] + [rng.getrandbits(40) for _ in range(rng.randint(0, 6))]
        op = rng.random()
        if op < 0.5:
            n = len(key)
            ws = rng.randint(0, n) * ps  # the request's SWA-evicted cursor, anywhere in the key
            prio = rng.randrange(3)
            got = []
            for tree in trees:
                if not room_for(tree, n, ps):
                    got.append(None)
                    continue
                fresh = tree.pools.alloc_extend_pages([0], [n * ps])[0]
                tree.pools.free_swa_of(fresh[: ws // ps])  # released out of the window before the insert
                r = tree.insert(key, fresh, swa_evicted_tokens=ws, priority=prio)
                got.append((r.prefix_tokens, r.last_node.id))
            assert got[0] == got[1]
            built += got[0] is not None and got[0][0] < n * ps
        elif op < 0.65:
            for tree in trees:
                tree.match(list(key))
        elif op < 0.8:
            evict_all(trees, rng.randint(1, 8) * ps)
        elif op < 0.92:
            lock_all(trees, locks, key)
        else:
            unlock_all(trees, locks)
        for tree in trees:
            tree.check_integrity()
        assert _state(trees[0]) == _state(trees[1])
    assert _victims(trees[0]) == _victims(trees[1])
    return built


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_a_new_swa_leaf_built_directly_is_the_leaf_split_twice(seed):
    _run(seed)


def test_the_direct_build_runs():
    """Over fixed seeds new leaves are built (with tombstones, SWA parts and capped leaves)."""
    assert sum(_run(seed) for seed in range(6)) > 100
