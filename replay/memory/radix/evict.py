"""Device and host eviction for the radix tree (DESIGN.md §4.3).

* FULL: a heap over evictable device leaves ranked by the policy; a backed-up leaf is demoted
  (device copy freed, node stays host-only), an unbacked one is deleted (or, under
  write_back, backed up first); parents that become leaves join the heap.
* SWA: the device SWA LRU walked from the tail, skipping SWA-locked nodes; a device leaf is
  evicted through the FULL leaf path (SWA pressure deletes its full KV), an internal node is
  tombstoned (SWA freed, FULL kept).
* After a deletion, childless unlocked ancestors with no FULL on either tier are deleted.
* Host: FULL via a heap over host leaves; SWA via the host SWA LRU (internal nodes lose only
  their SWA host copy).
"""

from __future__ import annotations

from replay.memory.radix.match import void_memos
from replay.memory.results import EvictResult


class EvictMixin:
    """Eviction half of ``RadixTree``."""

    #: evict a childless device leaf of an SWA tree with no host tier by ``_delete_plain_leaf``
    #: (``evict_device_leaf``'s steps inlined); off only to test that it is exact
    plain_leaf_eviction = True

    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> EvictResult:
        """Free at least the requested tokens beyond what is available now, if evictable.

        As SGLang's ``evict_for_alloc``: each request becomes an availability target
        (available + request); the FULL walk runs until its target is met or nothing is
        evictable, then the SWA walk (skipped when FULL's cascade already met it).

        Args:
            full_tokens: full-pool shortfall.
            swa_tokens: SWA-pool shortfall (ignored without an SWA component).
        Returns:
            EvictResult with tokens freed per pool and node counts.
        Mutates: tree, ledgers, pools.
        """
        res = EvictResult()
        # targets are fixed up front: collateral frees of one walk count toward the other
        full_target = self.full_available_tokens() + full_tokens
        swa_target = self.swa_available_tokens() + swa_tokens
        try:
            if full_tokens > 0:
                self._evict_full(full_target, res)
            if swa_tokens > 0 and self.swa_tree:
                if self.swa_available_tokens() < swa_target and res.swa_tokens < swa_tokens:
                    self._evict_swa(swa_tokens, swa_target, res)
            elif swa_tokens > 0 and self.pools.has_swa:
                # FULL-only tree over SWA pools (EIC): SWA comes back only with FULL leaves.
                self._evict_full(swa_target, res, swa_target=True)
        finally:
            self._flush()
        return res

    # ---- FULL --------------------------------------------------------------------------

    def _evict_full(self, target: int, res: EvictResult, swa_target: bool = False) -> None:
        avail = self.swa_available_tokens if swa_target else self.full_available_tokens
        pop, evict_leaf = self.device_heap.pop, self.evict_device_leaf
        plain = self.plain_leaf_eviction and self.swa_tree and not self.hicache  # see ``_delete_plain_leaf``
        while avail() < target:
            node = pop()
            if node is None:
                break
            if plain and not node.children:
                self._delete_plain_leaf(node, res)
            else:
                evict_leaf(node, res)  # a parent that becomes a leaf is pushed

    def _delete_plain_leaf(self, node, res: EvictResult) -> None:
        """``evict_device_leaf`` of a childless device leaf of an SWA tree with no host tier (no
        backup, no demotion: ``_delete_subtree`` of the node alone), its steps inlined in the same
        order: its SWA freed (deferred) and taken, its FULL taken and freed (deferred), the node
        detached, its parent's leaf sets updated and its dead ancestors deleted. The tree version
        advances once per step as there (three stamps)."""
        ps = self.ps
        swa = node.swa
        full = node.full
        parent = node.parent
        watch = node.watch
        if watch is not None:  # (the first of the three stamps voids the node's watchers)
            node.watch = None
            void_memos(watch)
        if swa is not None:
            n = len(swa) * ps
            res.swa_tokens += n
            self._swa_chunks.append(full)  # ``_defer_swa``: the tree tracks SWA, so ``full`` are the peers
            self._pending_swa_pages += len(full)
            node.swa = None
            if node.swa_lock > 0:
                self.swa_protected -= n
            else:
                self.swa_evictable -= n
            self.swa_lru.remove(node)
            self.version += 1
        node.full = None
        parent.dev_children -= 1
        n = len(full) * ps
        if node.full_lock > 0:
            self.full_protected -= n
        else:
            self.full_evictable -= n
        res.full_tokens += n
        if full:  # ``_defer_full``
            self._full_chunks.append(full)
            self._pending_full_pages += len(full)
        self.device_leaves.discard(node)
        if self.host_leaves:
            self.host_leaves.discard(node)
        self.num_nodes -= 1
        res.num_deleted_nodes += 1
        del parent.children[node.key[0]]
        self.version += 2
        node.mod = self.version
        self._update_leaf_sets(parent)
        self._delete_dead_ancestors(parent, res)

    def evict_device_leaf(self, node, res: EvictResult) -> None:
        """Evict one device leaf: demote if backed up, else back up (write_back) or delete."""
        if node.full_host is None and self.hicache and self.write_back:
            if not self.backup(node, write_back=True):
                self._delete_subtree(node, res)
                return
        if node.full_host is not None:
            self._demote(node, res)
        else:
            self._delete_subtree(node, res)

    def _demote(self, node, res: EvictResult) -> None:
        if node.swa is not None:
            res.swa_tokens += len(node.swa) * self.ps
            self._defer_swa(node.full)
            self._take_swa(node)
        pages = self._take_full(node)
        res.full_tokens += len(pages) * self.ps
        self._free_full_device(pages)
        res.num_demoted_nodes += 1
        self._update_leaf_sets(node)
        self._update_leaf_sets(node.parent)

    def _release_node(self, node, res: EvictResult) -> None:
        """Free every tier of ``node`` (device SWA first) and detach it from the lists."""
        ps = self.ps
        if node.swa is not None:
            res.swa_tokens += len(node.swa) * ps
            self._defer_swa(node.full)
            self._take_swa(node, to_host_lru=False)
        if node.full is not None:
            pages = self._take_full(node)
            res.full_tokens += len(pages) * ps
            self._free_full_device(pages)
        if node.swa_host is not None:
            res.host_swa_tokens += self.host_swa.free_pages(self._take_swa_host(node))
        if node.full_host is not None:
            res.host_full_tokens += self.host_full.free_pages(self._take_full_host(node))
        self.device_leaves.discard(node)
        self.host_leaves.discard(node)
        self.num_nodes -= 1
        res.num_deleted_nodes += 1

    def _delete_subtree(self, node, res: EvictResult) -> None:
        """Delete ``node`` and its (host-only) descendants, then dead ancestors."""
        if node.children:
            stack, order = list(node.children.values()), []
            while stack:
                cur = stack.pop()
                order.append(cur)
                stack.extend(cur.children.values())
            for cur in reversed(order):
                self._release_node(cur, res)
        self._release_node(node, res)
        parent = node.parent
        del parent.children[node.key[0]]
        self._changed(node)  # detached: a walk through it reads the parent's entry no more
        self._update_leaf_sets(parent)
        self._delete_dead_ancestors(parent, res)

    def _delete_dead_ancestors(self, cur, res: EvictResult) -> None:
        """Delete childless, unlocked ancestors whose FULL is gone from both tiers."""
        root = self.root
        while cur is not root and not cur.children:
            if cur.full_lock or cur.swa_lock:
                break
            if cur.full is not None or cur.full_host is not None:
                self._update_leaf_sets(cur)
                break
            parent = cur.parent
            self._release_node(cur, res)
            del parent.children[cur.key[0]]
            self._changed(cur)  # detached
            self._update_leaf_sets(parent)
            cur = parent

    # ---- SWA ---------------------------------------------------------------------------

    def _evict_swa(self, request_tokens: int, target: int, res: EvictResult) -> None:
        lru = self.swa_lru
        cursor = lru.lru()
        while cursor is not None and res.swa_tokens < request_tokens:
            if cursor not in lru:
                cursor = lru.lru()
                continue
            x = cursor
            cursor = lru.prev_unlocked(x)
            if x in self.device_leaves:
                self.evict_device_leaf(x, res)
            else:
                if self.hicache and self.write_back:
                    self._write_back_before_tombstone(x)
                self._tombstone(x, res)
            if self.swa_available_tokens() >= target:
                break

    def _write_back_before_tombstone(self, node) -> None:
        """Under write_back, back up an unbacked internal node (FULL and its window's SWA)
        before its SWA is tombstoned, as SGLang's ``InternalStateBackup``: only when neither
        its FULL nor its SWA has a host copy and the window has unbacked SWA; the SWA host
        pool is first cleared of the whole window's tokens when it holds fewer."""
        if self.host_swa is None or node.swa_host is not None or node.full_host is not None:
            return
        need = sum(len(n.key) for n in self._swa_window_unbacked(node)) * self.ps
        if not need:
            return
        if self.host_swa.available_tokens() < need:
            self.evict_host(swa_tokens=need)
        self.backup(node, write_back=True)

    def _tombstone(self, node, res: EvictResult) -> None:
        res.swa_tokens += len(node.swa) * self.ps
        self._defer_swa(node.full)
        self._take_swa(node)
        res.num_tombstoned_nodes += 1

    # ---- host --------------------------------------------------------------------------

    def evict_host(self, full_tokens: int = 0, swa_tokens: int = 0) -> EvictResult:
        """Free host slots: FULL from host leaves by policy, SWA from the host SWA LRU.

        Returns:
            EvictResult (host_* fields filled).
        Mutates: tree, host pools.
        """
        res = EvictResult()
        try:
            self._evict_host(full_tokens, swa_tokens, res)
        finally:
            self._flush()
        return res

    def _evict_host(self, full_tokens: int, swa_tokens: int, res: EvictResult) -> None:
        if full_tokens > 0 and self.host_full is not None:
            while res.host_full_tokens < full_tokens:
                node = self.host_heap.pop()
                if node is None:
                    break
                self._evict_host_leaf(node, res)
        if swa_tokens > 0 and self.host_swa is not None:
            lru = self.swa_host_lru
            x = lru.lru()
            while x is not None and res.host_swa_tokens < swa_tokens:
                nxt = lru.prev_unlocked(x)
                if x in self._host_pinned:
                    pass
                elif x in self.host_leaves:
                    self._evict_host_leaf(x, res)
                else:
                    res.host_swa_tokens += self.host_swa.free_pages(self._take_swa_host(x))
                x = nxt if (nxt is None or nxt in lru) else lru.lru()

    def _evict_host_leaf(self, node, res: EvictResult) -> None:
        parent = node.parent
        self._release_node(node, res)
        del parent.children[node.key[0]]
        self._changed(node)  # detached: a walk through it reads the parent's entry no more
        self._update_leaf_sets(parent)
        self._delete_dead_ancestors(parent, res)
