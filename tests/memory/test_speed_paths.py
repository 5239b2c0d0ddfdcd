"""The reference backend's fast paths decide exactly as the paths they replace: the list free
list against a head-first model of it, ``touch`` against ``match``, vectorized page keys against
their own incremental form, and a reference replay without torch."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from replay.backends.reference.keys import PageKeys
from replay.memory.allocator import DeviceAllocator

from .conftest import seq


@pytest.mark.parametrize("mode", ["prepend", "append", "sorted_merge"])
def test_free_list_matches_a_head_first_list(mode):
    rng = random.Random(7)
    a = DeviceAllocator(64 * 4, 4, mode)
    free, staged, held = list(range(1, 65)), [], []  # head first, as SGLang's tensor
    for _ in range(400):
        if held and rng.random() < 0.45:
            chunk = held.pop(rng.randrange(len(held)))
            a.free_page_chunks([chunk])
            if mode == "sorted_merge":
                staged += chunk
            else:
                free = chunk + free if mode == "prepend" else free + chunk
        else:
            n = rng.randint(0, 6)
            if n > len(free) and staged:
                free, staged = sorted(free + staged), []
            got = a.alloc_page_list(n)
            if n > len(free):
                assert got is None
                continue
            assert got == free[:n]
            free = free[n:]
            held.append(got)
        assert a.free_pages.tolist() == free and a.available_pages() == len(free) + len(staged)
        a.check_integrity()


def test_free_group_releases_token_frees_then_page_frees():
    a = DeviceAllocator(16, 4, "prepend")
    a.alloc_page_list(3)  # pages 1..3
    a.free_group_begin()
    a.free_page_ids([1])
    a.free([8, 9])  # page 2, by token
    assert a.pending_group_page_ids().tolist() == [1, 2] and a.available_pages() == 1
    a.free_group_end()
    assert a.free_pages.tolist() == [1, 2, 4]


def _tree_state(model):
    """Every node's key, recency stamp and locks (children by key), and the SWA LRU order."""
    tree, nodes, stack = model.tree, [], [model.tree.root]
    while stack:
        node = stack.pop()
        nodes.append((tuple(node.key), node.last_access, node.full_lock))
        stack.extend(node.children[k] for k in sorted(node.children))
    lru, k = tree.swa_lru, tree.swa_lru.k
    order, cur = [], lru.head.lru_next[k]
    while cur is not lru.tail:
        order.append(tuple(cur.key))
        cur = cur.lru_next[k]
    return nodes, order


@pytest.mark.parametrize("window", [0, 8])
def test_touch_has_the_effects_of_a_discarded_match(make_model, window):
    def build():
        kw = dict(page_size=4, full_pool_tokens=512, debug_check_every_op=True)
        if window:
            kw.update(sliding_window_tokens=window, swa_pool_tokens=512)
        m = make_model(**kw)
        for rid, tag, n in (("a", 1, 6), ("b", 1, 9), ("c", 2, 5)):
            keys = seq(tag, n)
            m.admit(rid, keys, m.match(keys))
            assert m.alloc_extend(rid, n * 4 - m.request(rid).seq_tokens)
            m.release(rid)
        return m

    # (keys, max_tokens): a limit cuts the walk as ``match``'s does (a stretch replays a refused
    # head's limited matches by ``touch``), splitting where it ends inside a node
    probes = [(seq(1, 4), None), (seq(1, 12), None), (seq(2, 3) + [5], None), (seq(3, 2), None),
              (seq(1, 9), 21), (seq(2, 5), 9), (seq(1, 6), 0)]
    a, b = build(), build()
    for p, max_tokens in probes:
        a.match(p, max_tokens=max_tokens)
        b.touch(p, max_tokens=max_tokens)
        assert _tree_state(a) == _tree_state(b), (p, max_tokens)
    for p, max_tokens in probes:  # the same matches afterwards (splits, recency)
        ma, mb = a.match(p, max_tokens=max_tokens), b.match(p, max_tokens=max_tokens)
        assert (ma.device_hit_tokens, ma.prefix_pages) == (mb.device_hit_tokens, mb.prefix_pages)


def test_page_keys_incremental_equals_one_shot_and_chain_prefixes():
    rng = np.random.default_rng(3)
    toks = rng.integers(1, 2**31, size=4000)
    out = rng.integers(1, 2**31, size=300).tolist()
    whole = PageKeys(np.concatenate([toks, out]), 16).up_to(5000)
    grown_out: list[int] = []
    k = PageKeys(toks, 16, grown_out)
    k.up_to(1000)
    for t in out:
        grown_out.append(t)
        k.up_to(rng.integers(0, 5000))
    assert k.up_to(5000) == whole and len(whole) == 4300 // 16
    other = toks.copy()
    other[16 * 7 + 3] += 1
    diff = PageKeys(other, 16).up_to(4000)
    assert diff[:7] == whole[:7] and all(x != y for x, y in zip(diff[7:], whole[7:250]))
    assert len(set(whole)) == len(whole) and all(0 <= x < 2**63 for x in whole)


def test_reference_replay_path_does_not_import_torch():
    code = ("import sys, replay.runs.replay, replay.backends.reference.run, replay.memory; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _branchy_model(make_model, window: int, pool_tokens: int, rng, requests: int, private_pages: int,
                   release_p: float):
    """A model (page 4; SWA of ``window`` tokens, none at 0) whose tree has shared and private
    branches, some of them still locked: ``requests`` admitted and filled, each released with
    probability ``release_p``."""
    kw = dict(page_size=4, full_pool_tokens=pool_tokens)
    if window:
        kw.update(sliding_window_tokens=window, swa_pool_tokens=pool_tokens)
    m = make_model(**kw)
    for i in range(requests):
        keys = seq(rng.randint(1, 3), rng.randint(2, 9)) + seq(100 + i, rng.randint(0, private_pages))
        rid = f"r{i}"
        m.admit(rid, keys, m.match(keys))
        assert m.alloc_extend(rid, len(keys) * 4 - m.request(rid).seq_tokens)
        if rng.random() < release_p:
            m.release(rid)
    return m


@pytest.mark.parametrize("window", [0, 8, 24])
def test_lock_delta_is_what_lock_moves_from_evictable_to_protected(make_model, window):
    m = _branchy_model(make_model, window, 1024, random.Random(window), 12, 3, 0.7)
    tree, seen = m.tree, set()
    for tag in (1, 2, 3, 4):
        for n in (1, 3, 6, 12):
            node = m.match(seq(tag, n)).last_device_node
            want = tree.lock_delta(node)
            seen.add((want[0] > 0, want[1] > 0))
            ev0 = (tree.full_evictable, tree.swa_evictable)
            receipt = tree.lock(node)
            assert want == (ev0[0] - tree.full_evictable, ev0[1] - tree.swa_evictable)
            tree.unlock(receipt)
            assert (tree.full_evictable, tree.swa_evictable) == ev0
    assert (True, bool(window)) in seen


@pytest.mark.parametrize("window", [0, 16])
def test_growing_keys_memo_and_match_limit_decide_as_plain_lists(make_model, window):
    """Matches of ``GrowingKeys`` lists (node-key comparisons remembered, page limit passed to
    the tree) give the same results and tree as matches of fresh, pre-cut plain lists, through
    splits, evictions and growing keys."""
    from replay.memory.radix.match import GrowingKeys

    def model():
        kw = dict(page_size=4, full_pool_tokens=4 * 160, debug_check_every_op=False)
        if window:
            kw.update(sliding_window_tokens=window, swa_pool_tokens=4 * 160)
        return make_model(**kw)

    a, b = model(), model()
    rng = random.Random(11 + window)
    prompts = [seq(t, 40) for t in range(1, 4)]
    grown = [GrowingKeys() for _ in range(12)]
    plain = [[] for _ in range(12)]
    for step in range(300):
        i = rng.randrange(12)
        base = prompts[i % 3]
        if len(plain[i]) < 60 and rng.random() < 0.5:  # the request's keys grow
            extra = base[len(plain[i]):len(plain[i]) + rng.randint(1, 12)] or [10_000 * i + step]
            grown[i].extend(extra)
            plain[i] = plain[i] + extra
        if not plain[i]:
            continue
        cap = rng.randint(0, len(plain[i]) * 4 + 4)
        ma = a.match(grown[i], max_tokens=cap)
        mb = b.match(list(plain[i][: cap // 4]))
        assert (ma.device_hit_tokens, ma.prefix_pages, ma.swa_branching_tokens) == (
            mb.device_hit_tokens, mb.prefix_pages, mb.swa_branching_tokens)
        if rng.random() < 0.3:
            a.touch(grown[i])
            b.touch(list(plain[i]))
        if rng.random() < 0.4:  # insert a variant: splits nodes under the remembered keys
            n = rng.randint(1, len(plain[i]))
            keys = plain[i][:n] + ([] if rng.random() < 0.5 else [99_000 + step])
            for m in (a, b):
                rid = f"s{step}"
                m.admit(rid, keys, m.match(keys))
                if m.alloc_extend(rid, len(keys) * 4 - m.request(rid).seq_tokens):
                    m.release(rid)
                else:
                    m.release(rid, checkpoint=False)
        if rng.random() < 0.15:
            n = rng.randint(1, 60) * 4
            assert a.evict(n, n if window else 0) == b.evict(n, n if window else 0)
    assert _tree_state(a) == _tree_state(b)
    assert sum(len(g.verified) for g in grown) > 5  # the memo was used


def test_path_pages_from_is_the_tail_of_path_pages():
    """A checkpoint copies only the path's pages past the request's protected prefix: the same
    pages as the whole path sliced, for every cut, on random chains of nodes (``path_pages`` is
    the cut at 0)."""
    from types import SimpleNamespace

    from replay.memory.radix.tree import RadixTree

    rng = random.Random(11)
    for _ in range(500):
        tree = SimpleNamespace(root=SimpleNamespace(full=None, parent=None))
        node, nxt = tree.root, 1
        for _ in range(rng.randint(0, 6)):
            k = rng.randint(1, 5)
            node = SimpleNamespace(full=list(range(nxt, nxt + k)), parent=node)
            nxt += k
        whole, cur = [], node  # the path's pages, root first, gathered the plain way
        while cur is not tree.root:
            whole[:0] = cur.full
            cur = cur.parent
        for lo in range(len(whole) + 3):
            assert RadixTree.path_pages_from(tree, node, lo) == whole[lo:]


def _whole_state(model):
    """Everything eviction changes: each node's key, values, locks, stamps and ``mod`` (children by
    key), the ledgers, the tree's version and node count, the SWA LRU order, the device leaf set
    and both free lists."""
    tree, nodes, stack = model.tree, [], [model.tree.root]
    while stack:
        node = stack.pop()
        nodes.append((tuple(node.key), node.full, node.swa, node.full_lock, node.swa_lock, node.last_access,
                      node.mod, node.dev_children, node.swa_uuid))
        stack.extend(node.children[k] for k in sorted(node.children))
    ledgers = (tree.full_evictable, tree.full_protected, tree.swa_evictable, tree.swa_protected, tree.version,
               tree.num_nodes)
    leaves = sorted(tuple(n.key) for n in tree.device_leaves)
    pools = model.pools
    return nodes, ledgers, _tree_state(model)[1], leaves, pools.full.free_pages.tolist(), pools.swa.free_pages.tolist()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_plain_leaf_eviction_is_evict_device_leaf(make_model, seed):
    """``_delete_plain_leaf`` (a childless device leaf of an SWA tree with no host tier) leaves the
    tree, its ledgers, version and stamps, the SWA LRU order and the free lists exactly as
    ``evict_device_leaf`` does, through random admissions, chunked inserts, releases, out-of-window
    releases and evictions of both pools."""
    def drive(fast: bool):
        m = make_model(page_size=4, full_pool_tokens=640, sliding_window_tokens=8, swa_pool_tokens=320)
        m.tree.plain_leaf_eviction = fast
        rng, out, live = random.Random(seed), [], []
        for i in range(160):
            r = rng.random()
            if live and r < 0.3:
                rid = live.pop(rng.randrange(len(live)))
                m.release(rid, checkpoint=rng.random() < 0.8)
            elif live and r < 0.45:
                rid = rng.choice(live)
                st = m.request(rid)
                m.free_swa_out_of_window(rid, st.seq_tokens - 1)
                m.checkpoint(rid)
            elif r < 0.6:
                res = m.evict(rng.randint(0, 96), rng.randint(0, 64))
                out.append((res.full_tokens, res.swa_tokens, res.num_deleted_nodes, res.num_tombstoned_nodes))
            else:
                keys = seq(rng.randint(1, 4), rng.randint(2, 6)) + seq(100 + i, rng.randint(1, 8))
                rid = f"r{i}"
                m.admit(rid, keys, m.match(keys))
                need = len(keys) * 4 - m.request(rid).seq_tokens
                res = m.make_room(need + 4, need + 4)
                out.append((res.full_tokens, res.swa_tokens, res.num_deleted_nodes))
                if m.alloc_extend(rid, need):
                    live.append(rid)
                else:
                    m.release(rid, checkpoint=False)
            out.append(_whole_state(m))
        return out

    fast, slow = drive(True), drive(False)
    assert len(fast) == len(slow)
    for i, (a, b) in enumerate(zip(fast, slow)):
        assert a == b, f"op {i}"
    assert any(isinstance(x, tuple) and len(x) in (3, 4) and x[2] > 0 for x in fast)  # leaves were deleted


@pytest.mark.parametrize("window", [0, 8, 24])
def test_relock_is_lock_then_unlock(make_model, window):
    """``relock`` (a checkpoint moving a request's lock to the node its insert ended at: the FULL
    walk stops at the old anchor) leaves the lock counts, ledgers, leaf sets and SWA boundaries as
    ``lock`` then ``unlock`` do: on a descendant of the anchor, on the anchor itself, and on a
    node off its path (the general path)."""
    def build():
        return _branchy_model(make_model, window, 2048, random.Random(window + 5), 14, 4, 0.6)

    def state(m):
        tree, nodes, stack = m.tree, [], [m.tree.root]
        while stack:
            node = stack.pop()
            nodes.append((tuple(node.key), node.full_lock, node.swa_lock, node.swa_uuid))
            stack.extend(node.children[k] for k in sorted(node.children))
        return (nodes, tree.full_evictable, tree.full_protected, tree.swa_evictable, tree.swa_protected,
                sorted(tuple(n.key) for n in tree.device_leaves), tree._next_uuid)

    probes = [(seq(1, 2), seq(1, 7)), (seq(1, 7), seq(1, 7)), (seq(2, 3), seq(2, 9)), (seq(1, 5), seq(3, 4)),
              (seq(3, 1), seq(3, 9)), (seq(2, 9), seq(1, 3))]
    fast_runs = 0
    for anchor_keys, node_keys in probes:
        a, b = build(), build()
        for m in (a, b):
            m.match(anchor_keys), m.match(node_keys)  # (splits where the probes end inside a node)
        ra = a.tree.lock(a.match(anchor_keys).last_device_node)
        rb = b.tree.lock(b.match(anchor_keys).last_device_node)
        na, nb = a.match(node_keys).last_device_node, b.match(node_keys).last_device_node
        assert state(a) == state(b)
        new_a = a.tree.lock(na)
        a.tree.unlock(ra)
        new_b = b.tree.relock(rb, nb)
        assert state(a) == state(b), (anchor_keys[:1], len(anchor_keys), node_keys[:1], len(node_keys))
        assert (new_a.swa_uuid, rb.released) == (new_b.swa_uuid, True)
        b.tree.unlock(new_b)
        a.tree.unlock(new_a)
        assert state(a) == state(b)
        a.check_integrity(), b.check_integrity()
        cur = nb
        while cur is not None and cur is not rb.node:
            cur = cur.parent
        fast_runs += cur is not None and rb.node is not b.tree.root
    assert fast_runs >= 3  # the anchor on the node's path (the fast walk), and off it
    with pytest.raises(Exception, match="released twice"):
        b.tree.relock(rb, nb)
