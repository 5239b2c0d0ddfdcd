"""Insert (checkpoint) into the radix tree: duplicate frees, tombstone recovery, SWA windows.

Semantics (DESIGN.md §4.3, SGLang ``checkpoint_into_tree``), re-implemented:

* walk the key; split partially matched nodes; a device-evicted node adopts the request's
  fresh pages; an overlapping live node keeps its pages and the request's duplicates in
  ``[prev_prefix, ...)`` are freed (full-only below the request's SWA-evicted cursor);
* overlapping an SWA tombstone inside the request's live window: an unlocked node adopts the
  incoming pages (old full pages freed full-only), a locked one keeps its full pages and takes
  over the incoming SWA pages;
* a new leaf is clipped at the request's SWA-evicted cursor (the older part becomes a
  tombstone) and capped at ceil(W) to a page, so locking it pins one window.
"""

from __future__ import annotations

from replay.memory.radix.match import chained_common, void_memos
from replay.memory.radix.node import Node
from replay.memory.results import InsertResult


class InsertMixin:
    """Insert half of ``RadixTree``."""

    def insert(
        self,
        key: list[int],
        pages: list[int],
        prev_prefix_tokens: int = 0,
        swa_evicted_tokens: int = 0,
        inserted_tokens: int = 0,
        priority: int = 0,
        swa_branching_tokens: int | None = None,
        num_pages: int | None = None,
        owned=None,
    ) -> InsertResult:
        """Insert a page-aligned key with the request's page ids.

        Args:
            key: page hashes.
            pages: the request's full page ids for the same pages.
            prev_prefix_tokens: the request's ``cache_protected_len`` (already tree-owned).
            swa_evicted_tokens: the request's SWA-evicted cursor (page-aligned).
            inserted_tokens: tokens this request inserted before (no second hit count).
            priority: request priority (raises node priorities along the path).
            swa_branching_tokens: pending SWA branching point of the request, if any.
            num_pages: insert only the first ``num_pages`` of ``key`` and ``pages`` (both at
                least that long; None: all of them, both the same length), without copying them.
            owned: the node the request's first ``prev_prefix_tokens`` end at, which its lock
                holds (its previous insert's last node): with chained keys the walk takes the
                path to it by its parents (stamping it and raising its priority as the walk
                would; the path is the request's own, so nothing there splits, adopts, frees or
                counts a hit) once that node is still the one the key's pages lead to.
        Returns:
            InsertResult with the tree prefix before the insert and the last node.
        Mutates: tree structure and ledgers; frees duplicate pages into the pools.
        """
        if num_pages is None:
            if len(key) != len(pages):
                raise ValueError("insert: key and pages differ in length")
            num_pages = len(key)
        elif not 0 <= num_pages <= min(len(key), len(pages)):
            raise ValueError(f"insert: num_pages {num_pages} outside the key ({len(key)}) or pages ({len(pages)})")
        try:
            return self._insert(key, pages, num_pages, prev_prefix_tokens, swa_evicted_tokens,
                                inserted_tokens, priority, swa_branching_tokens, owned)
        finally:
            self._flush()

    def _insert(self, key, pages, n, prev_prefix_tokens, swa_evicted_tokens, inserted_tokens,
                priority, swa_branching_tokens, owned=None) -> InsertResult:
        ps = self.ps
        if swa_evicted_tokens % ps:
            raise ValueError("insert: swa_evicted_tokens must be page-aligned")
        root = self.root
        root.last_access = self.tick()
        root.priority = max(root.priority, priority)
        prev_pages = prev_prefix_tokens // ps
        ws_pages = swa_evicted_tokens // ps
        node, pos, dups = root, 0, 0
        kept = False  # a live node past ``prev_pages`` kept its pages (``_overlap``)
        chained = self.chained_keys
        if owned is not None and chained and 0 < prev_pages <= n and prev_prefix_tokens <= inserted_tokens:
            path = self._owned_path(owned, key, prev_pages)
            if path is not None:  # what the walk does to each node of the request's own prefix
                clock = self.clock  # a tick per node, as the walk takes them
                for child in reversed(path):
                    child.last_access = clock
                    clock += 1.0
                    if child.priority < priority:
                        child.priority = priority
                    # (no ``_touch_leaf``: a FULL-locked node with device FULL is in no leaf set)
                self.clock = clock
                node, pos = owned, prev_pages
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access = self.tick()
            ck = child.key
            m = len(ck)
            if chained:
                if pos + m > n:  # (the key may run past ``n``)
                    m = n - pos
                if ck[m - 1] != key[pos + m - 1]:
                    m = chained_common(ck, key, pos, m)
            elif pos + m > n or ck != key[pos : pos + m]:
                m = 0
                limit = min(len(ck), n - pos)
                while m < limit and ck[m] == key[pos + m]:
                    m += 1
            if m < len(ck):
                child = self._split(child, m)
            child.priority = max(child.priority, priority)
            if child.full is None:
                self._unevict(child, pages[pos : pos + m], pos, ws_pages)
            elif pos + m > prev_pages:  # a node the request already owned whole overlaps nothing
                dups += self._overlap(child, pages[pos : pos + m], pos, prev_pages, ws_pages)
                kept = True
            if (pos + m) * ps > inserted_tokens and self._inc_hit_and_check(child):
                self.backup(child)
            self._touch_leaf(child)
            node, pos = child, pos + m
        prefix_tokens = pos * ps
        new_leaf = pos < n
        if new_leaf:
            if self.swa_tree:
                node = self._add_swa_leaf(node, key, pages, pos, n, ws_pages, priority)
            else:
                node = self._add_leaf(node, key[pos:n], pages[pos:n], priority)
        if node is not root:
            self.refresh_swa_lru(node)
            if new_leaf:
                if n * ps > inserted_tokens and self._inc_hit_and_check(node):
                    self.backup(node)
                self._touch_leaf(node)
            elif self.hicache and not self.write_back and node.full_host is not None:
                self.backup_incremental(node)
        branch_done = swa_branching_tokens is not None and n * ps >= swa_branching_tokens
        return InsertResult(prefix_tokens, node, dups, branch_done, kept)

    def _owned_path(self, owned, key, prev_pages: int) -> list | None:
        """The nodes from ``owned`` up to the root's child (bottom first) when the first
        ``prev_pages`` pages of ``key`` lead from the root exactly to ``owned`` and every node on
        the way holds device FULL and a FULL lock (the walk would take each whole and only stamp
        it), else None. Chained keys: ``owned``'s last page key equal to the key's at that depth
        means the path spells the key."""
        root = self.root
        parent = owned.parent
        if parent is None or parent.children.get(owned.key[0]) is not owned or owned.key[-1] != key[prev_pages - 1]:
            return None
        path, depth, cur = [], 0, owned
        while cur is not root:
            if cur.full is None or not cur.full_lock:
                return None
            path.append(cur)
            depth += len(cur.key)
            cur = cur.parent
        return path if depth == prev_pages else None

    def _add_swa_leaf(self, parent, key, pages, pos: int, n: int, ws_pages: int, priority: int):
        """``_add_leaf`` of pages ``[pos, n)`` under ``parent``, then ``_populate_swa(cap_leaf=True)``
        of it, built directly: the part below the request's SWA-evicted cursor a tombstone (no
        SWA), the part above the leaf's last ``ceil(W / ps)`` pages with SWA, the leaf with SWA,
        each node made once with its own slices. The nodes, ids, stamps, creation times, ledgers,
        leaf sets and SWA LRU order are those of the leaf and its two splits (the leaf's heap
        entries are fewer: the splits' re-pushes of it were stale at once). Returns the leaf."""
        ps = self.ps
        live = max(pos, ws_pages)
        tail = -(-self.window_tokens // ps)
        if live >= n or tail <= 0:  # no page in the window: no SWA, no split
            node = self._add_leaf(parent, key[pos:n], pages[pos:n], priority)
            if live < n:
                self._populate_swa(node, pos, ws_pages, cap_leaf=True)
            return node
        cut = n - tail if n - live > tail else live  # where the leaf starts
        self.version += 1
        # ids and ticks in the order of the leaf, then its splits: the leaf (2 ticks), the
        # tombstone (2 ticks, then the leaf re-stamped), the SWA part (likewise)
        c0 = self.clock
        nid = self._next_node_id
        leaf = Node(nid, key[cut:n], None, c0)
        nid += 1
        clock = c0 + 2.0
        born = leaf.creation_time
        chain = []  # top down: (node, its first page)
        for start, end in ((pos, live), (live, cut)):  # the tombstone, the SWA part: split off in turn
            if end > start:
                part = Node(nid, key[start:end], None, clock)
                nid += 1
                part.creation_time = born
                leaf.last_access = clock + 2.0  # the split re-stamps the leaf
                clock += 3.0
                chain.append((part, start))
        mid = chain[-1][0] if cut > live else None
        chain.append((leaf, cut))
        self._next_node_id = nid
        self.clock = clock
        up = parent
        for node, start in chain:
            node.priority = priority
            node.parent = up
            up.children[key[start]] = node
            up = node
        ends = parent.end_watch  # the memos that found no child here for this page are void
        if ends is not None:
            watch = ends.pop(key[pos], None)
            if watch is not None:
                void_memos(watch)
        ends_at = [start for _, start in chain[1:]] + [n]
        for (node, start), end in zip(chain, ends_at):
            self._set_full(node, pages[start:end])
        self.num_nodes += len(chain)
        self._update_leaf_sets(leaf)
        self._update_leaf_sets(parent)
        if mid is not None:
            self._set_swa(mid, self.pools.translate(mid.full))
        self._set_swa(leaf, self.pools.translate(leaf.full))
        return leaf

    def _unevict(self, node, seg: list[int], pos: int, ws_pages: int) -> None:
        """A device-evicted node adopts the request's fresh pages (no duplicate)."""
        self._set_full(node, seg)
        self._update_leaf_sets(node)
        self._update_leaf_sets(node.parent)
        if self.swa_tree:
            self._populate_swa(node, pos, ws_pages, cap_leaf=False)

    def _clip_to_window(self, node, pos: int, ws_pages: int):
        """Split off the part of a tombstone ``node`` (starting at page ``pos``) that lies
        below the window start; return the page where its live part starts, or None."""
        if node.swa is not None:
            return None
        end = pos + len(node.key)
        live = max(pos, ws_pages)
        if live >= end:
            return None
        if live > pos:
            self._split(node, live - pos)
        return live

    def _populate_swa(self, node, pos: int, ws_pages: int, cap_leaf: bool) -> None:
        """Give the in-window part of a freshly adopted node its SWA pages."""
        if self._clip_to_window(node, pos, ws_pages) is None:
            return
        if cap_leaf and node.swa_lock == 0:
            tail = -(-self.window_tokens // self.ps)
            if len(node.key) > tail:
                parent = self._split(node, len(node.key) - tail)
                self._set_swa(parent, self.pools.translate(parent.full))
        self._set_swa(node, self.pools.translate(node.full))

    def _overlap(self, node, seg: list[int], pos: int, prev_pages: int, ws_pages: int) -> int:
        """Handle a live node the key overlaps; free the request's duplicates. Returns #dups."""
        m = len(seg)
        consumed = m
        if self.swa_tree and prev_pages < pos + m:
            live = self._clip_to_window(node, pos, ws_pages)
            if live is not None:
                self._recover_swa(node, seg[live - pos :])
                consumed = live - pos
        dup_start = max(0, prev_pages - pos)
        if dup_start >= consumed:
            return 0
        dup = seg[dup_start:consumed]
        swa_gone = min(max(ws_pages - (pos + dup_start), 0), len(dup))
        self._defer_full(dup[:swa_gone])
        self._defer_swa(dup[swa_gone:])
        self._defer_full(dup[swa_gone:])
        return len(dup)

    def _recover_swa(self, node, incoming: list[int]) -> None:
        """Revive an SWA tombstone from the request's in-window pages."""
        if node.full_lock > 0:
            swa = self.pools.move_swa(incoming, node.full)
            self._defer_full(incoming)
        else:
            old = node.full
            node.full = incoming
            self._changed(node)
            self._defer_full(old)
            swa = self.pools.translate(incoming)
        self._set_swa(node, swa)
