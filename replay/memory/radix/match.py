"""Prefix match with the SWA window rule, and SWA LRU refresh (DESIGN.md §4.3)."""

from __future__ import annotations

import math
from operator import itemgetter

from replay.memory.results import MatchResult

_MEMO_MIN_PAGES = 8  # shorter node keys compare faster than a memo lookup
_second = itemgetter(1)


class GrowingKeys(list):
    """A list of page keys whose elements never change once there (it only grows).

    A match of such a list remembers, in ``verified`` (node -> (node key object, offset)), the
    nodes whose whole key it found equal to its slice at that offset; a node key is never
    changed in place (a split gives both halves new lists), so the same pair is not compared
    again (a waiting request is matched on every step and by every prefix refresh).

    ``walks`` (pages matched -> [tree, walk result]) remembers the last walk of each length. A
    walk reads, of each node it reaches through its parent's children entry for the next page
    (every node on its path, and the child it stopped at for holding no FULL on either tier),
    the key, which components it holds and its FULL value list; and, where it stopped for want
    of a child, the end node's (missing) entry for the next page. Every change to a node's own
    state goes through ``RadixTree._changed`` (a split changes the child it cuts, a node
    removed from its parent's children is changed), so an entry a walk followed cannot change
    unnoticed either; the only other change a walk can see is a new child for the page it
    found missing (``RadixTree._add_leaf``). The memo is entered in ``Node.watch`` of each node
    on its path and in the end node's ``Node.end_watch`` under that page, and each of those
    changes voids the memos entered there (:func:`void_memos`: the tree slot becomes None). So
    while a memo is not void, the walk would return the same result and is not repeated (a
    waiting request refused step after step, or refreshed by the waiting queue's prefix walk,
    while the tree changes elsewhere), and checking it costs one lookup. A walk that split a
    node is not remembered. The walk's effects (SWA LRU refresh, recency stamps) are applied on
    every match all the same.
    """

    __slots__ = ("verified", "walks")

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.verified: dict = {}
        self.walks: dict = {}


def chained_common(ck: list[int], key: list[int], off: int, lim: int) -> int:
    """The pages node key ``ck`` and ``key[off:]`` share, of the first ``lim`` (``ck[0] ==
    key[off]``), for chained keys (``MatchMixin.chained_keys``: a page key equal means every
    key before it equal, so the shared pages are found by bisection)."""
    if ck[lim - 1] == key[off + lim - 1]:
        return lim
    lo, hi = 1, lim - 1  # ck[:lo] equal, ck[hi] not
    while lo < hi:
        mid = (lo + hi) >> 1
        if ck[mid] == key[off + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def void_memos(memos: list) -> None:
    """Void walk memos (``GrowingKeys.walks`` entries) a tree change made stale."""
    for memo in memos:
        memo[0] = memo[1] = None


def _watch(memos: list, memo: list) -> None:
    """Enter ``memo`` in a watch list, dropping the void ones at each power-of-two length from 64
    (memos whose walk is never asked again stay until the node changes)."""
    memos.append(memo)
    n = len(memos)
    if n >= 64 and not n & (n - 1):
        memos[:] = [m for m in memos if m[0] is not None]


class MatchMixin:
    """Match half of ``RadixTree``."""

    #: reuse a walk whose nodes are unchanged (``GrowingKeys.walks``); off only to test that it
    #: is exact
    walk_memo = True
    #: walks answered from the memo (a count for tests and profiles)
    walk_memo_hits = 0
    #: the keys are chained (a page's key hashes everything up to the page's end, as the
    #: reference backend's, :mod:`replay.backends.reference.keys`): equal keys at a page mean
    #: equal keys before it, so a node key is compared with a key at its last page, and a partial
    #: match found by bisection (:func:`chained_common`); False compares page by page
    chained_keys = False
    #: inside ``touch_many``: the best nodes of the touches not yet applied, which a walk applies
    #: before it splits a node (a split copies a node's stamps); None outside it
    _touch_pending: list | None = None

    def refresh_swa_lru(self, node) -> None:
        """Move live-SWA nodes at and above ``node`` to MRU.

        ``full_ancestry`` moves every ancestor; ``window_aware`` stops once W + ps tokens
        above ``node`` are covered (sgl-project/sglang#26615), so out-of-window SWA ages out.
        """
        if not self.swa_tree or node is self.root:
            return
        limit = self.window_tokens + self.ps if self.window_aware else math.inf
        chain, acc, cur, root, ps = [], 0, node, self.root, self.ps
        while cur is not root and acc < limit:
            if cur.swa is not None:
                chain.append(cur)
            acc += len(cur.key) * ps
            cur = cur.parent
        self.swa_lru.move_chain_to_mru(chain)

    def _stamp_path(self, node) -> None:
        t = self.tick()
        dev, host = self.device_leaves, self.host_leaves
        while node is not None:
            node.last_access = t
            t -= 1e-5
            if node in dev or node in host:
                self._touch_leaf(node)
            node = node.parent

    # ---- match -------------------------------------------------------------------------

    def match(self, key: list[int], limit: int | None = None) -> MatchResult:
        """Longest usable prefix of ``key`` (page hashes), with the SWA window rule.

        A node is usable when it has FULL KV and, for the SWA component, at least W tokens of
        unbroken SWA end at it (a run that starts at the root counts as unbroken). Partially
        matched nodes are split. The device hit uses device-only validators; with HiCache the
        best match may extend over host-only nodes.

        Args:
            key: page hashes of the request.
            limit: match at most this many pages of ``key`` (None: all of it).
        Returns:
            a MatchResult (tokens), with prefix_pages for the device hit.
        Mutates: splits, SWA LRU order, last_access stamps.
        """
        return self._finish_match(*self._match_walk(key, limit))

    def touch(self, key: list[int], limit: int | None = None) -> None:
        """``match`` (of at most ``limit`` pages) for its effects only (splits, SWA LRU refresh,
        recency stamps), without building a result (the scheduler's waiting-queue prefix refresh
        discards it, and so does a stretch's replay of the refused head's matches)."""
        best = self._match_walk(key, limit)[1]
        self.refresh_swa_lru(best)
        self._stamp_path(best)

    def _memo(self, key, n: int):
        """The memoized walk of the first ``n`` pages of ``key`` (a ``GrowingKeys``) when none of
        the nodes it read changed since (such a walk splits nothing), else None."""
        memo = key.walks.get(n)
        if memo is None or memo[0] is not self:
            return None
        self.walk_memo_hits += 1
        return memo[1]

    def touch_many(self, keys: list) -> list:
        """``touch`` of each key in turn, exactly, with the recency effects applied once per node.

        The walks run in order (a walk that splits a node first applies the effects of the
        touches before it, since a split copies a node's stamps; a walk reads no stamp, LRU order
        or heap, so the others need not). The effects
        of a run of walks are those of their touches in order: a node's stamp is the one the
        last touch through it gives (walking the touches from the last back, each stops at a
        node a later touch already stamped, whose ancestors that touch stamped too); the SWA LRU
        ends with the last touch's chain most recent, then each earlier chain's other nodes; a
        leaf is re-ranked once, with its final stamp (the heap's order reads only the stamps).
        Returns the walks' best nodes, in order (what :meth:`apply_touches` applies).
        """
        bests = []
        memo_ok = self.walk_memo
        try:
            for key in keys:
                walk = self._memo(key, len(key)) if memo_ok and type(key) is GrowingKeys else None
                if walk is None:
                    # the touches so far are applied only if this walk splits (``_match_walk``
                    # applies them right before): a walk reads no stamp, no LRU order, no heap
                    self._touch_pending = bests
                    walk = self._match_walk(key)
                    bests = self._touch_pending
                bests.append(walk[1])
        finally:
            self._touch_pending = None
        self._apply_touches(bests)
        return bests

    def apply_touches(self, bests: list) -> None:
        """The recency effects of touches whose walks ended at ``bests`` (see :meth:`touch_many`)."""
        self._apply_touches(bests)

    def _apply_touches(self, bests: list) -> None:
        if not bests:
            return
        n = len(bests)
        # each best node once, at its last touch, latest first: an earlier touch that ended at the
        # same node adds nothing (the later one stamps the same path after it, and its SWA chain
        # comes first); a refresh's ~100 walks end at ~12 nodes on an hour of traffic
        order = sorted(dict(zip(bests, range(n))).items(), key=_second, reverse=True)
        root = self.root
        if self.swa_tree:
            limit = self.window_tokens + self.ps if self.window_aware else math.inf
            chain, seen, ps = [], set(), self.ps
            for node, _ in order:
                acc, cur = 0, node
                while cur is not root and acc < limit:
                    if cur.swa is not None and cur not in seen:
                        seen.add(cur)
                        chain.append(cur)
                    acc += len(cur.key) * ps
                    cur = cur.parent
            if chain:
                self.swa_lru.move_chain_to_mru(chain)
        t0 = self.clock  # one tick per touch, as ``touch`` takes them (integral floats: exact sums)
        self.clock = t0 + n
        dev, host = self.device_leaves, self.host_leaves
        stamped = set()
        leaves = []
        for node, i in order:
            t = t0 + i
            while node is not None and node not in stamped:
                stamped.add(node)
                node.last_access = t
                t -= 1e-5
                if node in dev or node in host:
                    leaves.append(node)
                node = node.parent
        for node in leaves:
            self._touch_leaf(node)

    def _match_walk(self, key: list[int], limit: int | None = None, split: bool = True) -> tuple | None:
        """The walk of ``match``: (FULL values, best node, best device node, device chunks,
        FULL-hit pages). Mutates: splits (``split=False``: none; None where the walk would split
        a node, a pure read otherwise)."""
        n = len(key)
        if limit is not None and limit < n:
            n = max(0, limit)
        verified = version = None
        if type(key) is GrowingKeys:
            verified = key.verified
            if self.walk_memo:
                version = self.version
                memo = self._memo(key, n)
                if memo is not None:
                    return memo
        ps, window, swa, hicache = self.ps, self.window_tokens, self.swa_tree, self.hicache
        chained = self.chained_keys
        node, off = self.root, 0
        path = []  # the nodes whose own state the walk reads
        end = None  # the node under which it found no child for the next page
        values: list[list[int]] = []
        best = best_dev = self.root
        best_dev_chunks = 0
        full_hit_pages = 0
        run_any = run_dev = math.inf
        while off < n:
            child = node.children.get(key[off])
            if child is None:
                end = node
                break
            path.append(child)
            if child.full is None and child.full_host is None:
                break
            ck = child.key
            m = len(ck)
            if chained:
                if m > n - off:  # the node reaches past the key (or its limit): a partial match
                    m = n - off
                if ck[m - 1] != key[off + m - 1]:
                    m = chained_common(ck, key, off, m)
            elif m > n - off:  # the node reaches past the key (or its limit): a partial match
                m, lim = 0, n - off
                while m < lim and ck[m] == key[off + m]:
                    m += 1
            elif verified is not None and m >= _MEMO_MIN_PAGES:
                v = verified.get(child)
                if v is None or v[0] is not ck or v[1] != off:
                    if ck == key[off : off + m]:
                        verified[child] = (ck, off)
                    else:
                        m = 0
                        while ck[m] == key[off + m]:
                            m += 1
            elif ck != key[off : off + m]:
                m = 0
                while ck[m] == key[off + m]:
                    m += 1
            full_hit_pages += m
            partial = m < len(ck)
            if partial:
                if not split:
                    return None
                pending = self._touch_pending
                if pending:  # the touches before this walk take effect before the split
                    self._apply_touches(pending)
                    self._touch_pending = []
                child = self._split(child, m)
            if child.full is not None:
                values.append(child.full)
            ok_dev = child.full is not None
            ok_any = ok_dev or child.full_host is not None
            if swa:
                t = len(child.key) * ps
                if child.swa is None:
                    run_dev = 0
                    ok_dev = False
                else:
                    run_dev += t
                    ok_dev = ok_dev and run_dev >= window
                if child.swa is None and child.swa_host is None:
                    run_any = 0
                    ok_any = False
                else:
                    run_any += t
                    ok_any = ok_any and run_any >= window
            if not hicache:
                ok_any = ok_dev
            if ok_any:
                best = child
            if ok_dev:
                best_dev, best_dev_chunks = child, len(values)
            node = child
            off += m
            if partial:
                break
        result = values, best, best_dev, best_dev_chunks, full_hit_pages
        if version is not None and self.version == version:  # no split: the walk is a pure read
            key.walks[n] = memo = [self, result]
            for x in path:
                watch = x.watch
                if watch is None:
                    x.watch = [memo]
                else:
                    _watch(watch, memo)
            if end is not None:
                ends = end.end_watch
                if ends is None:
                    end.end_watch = {key[off]: [memo]}
                else:
                    watch = ends.get(key[off])
                    if watch is None:
                        ends[key[off]] = [memo]
                    else:
                        _watch(watch, memo)
        return result

    def peek(self, key: list[int], limit: int | None = None) -> MatchResult | None:
        """``match``'s result without its effects (no split, no SWA LRU refresh, no stamp) and
        without its ``prefix_pages`` (None: not built); None where the walk would split a node
        (``match`` would change the tree)."""
        walk = self._match_walk(key, limit, split=False)
        return None if walk is None else self._match_result(*walk, pages=False)

    def _finish_match(self, values, best, best_dev, best_dev_chunks, full_hit_pages) -> MatchResult:
        self.refresh_swa_lru(best)
        self._stamp_path(best)
        return self._match_result(values, best, best_dev, best_dev_chunks, full_hit_pages)

    def _match_result(self, values, best, best_dev, best_dev_chunks, full_hit_pages, pages: bool = True) -> MatchResult:
        ps, root = self.ps, self.root
        prefix: list[int] | None = None
        if pages:
            prefix = []
            for chunk in values[:best_dev_chunks]:
                prefix.extend(chunk)
            device_pages = len(prefix)
        else:
            device_pages = sum(map(len, values[:best_dev_chunks]))
        host_hit = 0
        cur = best
        while cur is not best_dev and cur is not root:
            if cur.full_host is not None:
                host_hit += len(cur.full_host)
            cur = cur.parent
        swa_host_hit = 0
        if self.swa_tree:
            covered, cur = 0, best
            while cur is not root and covered < self.window_tokens:
                if cur.swa is not None:
                    covered += len(cur.key) * ps
                elif cur.swa_host is not None:
                    swa_host_hit += len(cur.key)
                    covered += len(cur.key) * ps
                else:
                    break
                cur = cur.parent
        device_hit = device_pages * ps
        branching = None
        if self.swa_tree and full_hit_pages * ps > device_hit + host_hit * ps:
            branching = full_hit_pages * ps
        return MatchResult(
            device_hit_tokens=device_hit,
            host_hit_tokens=host_hit * ps,
            swa_host_hit_tokens=swa_host_hit * ps,
            full_kv_hit_tokens=full_hit_pages * ps,
            swa_branching_tokens=branching,
            prefix_pages=prefix,
            last_device_node=best_dev,
            best_match_node=best,
            tree_version=self.version,
        )
