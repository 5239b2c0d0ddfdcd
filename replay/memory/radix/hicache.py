"""HiCache for the radix tree: backups, load-back (DESIGN.md §4.3).

Transfers are modelled as instantaneous: a backup commits its host copy at once and a
load-back its device copy (SGLang's acks, in-flight pins and TP consensus are not modelled).

* ``write_through`` / ``write_through_selective``: an insert that raises a node's hit count to
  the threshold backs the node and its unbacked ancestors up (ancestors first);
* ``write_back``: a node is backed up only when FULL eviction reaches it;
* a backup also copies the device SWA of unbacked nodes within one window above the node
  (the walk stops at a node whose write-through is still pending);
* with ``defer_write_ack`` a write-through backup is acknowledged as SGLang acknowledges it, at
  the next scheduler step (``ack_write_through``): until then it holds a tree lock on its node
  (FULL to the root, SWA one window up) and marks the nodes it covered pending;
* ``load_back`` brings host-only FULL pages between the device hit and the best match back to
  device, plus host-only SWA within one window above the best match.
"""

from __future__ import annotations

from replay.memory.results import MemoryModelError


class HiCacheMixin:
    """HiCache half of ``RadixTree``."""

    def _inc_hit_and_check(self, node) -> bool:
        """Count an insert hit; True when a write-through backup is due."""
        if node.full is None or (self.hicache and self.write_back):
            return False
        node.hit_count += 1
        self._touch_leaf(node)
        return (
            self.hicache
            and node.full_host is None
            and node.hit_count >= self.write_through_threshold
        )

    def _alloc_host(self, pool, num_pages: int, swa: bool) -> list[int] | None:
        """Host pages, evicting host copies once when the pool is short.

        The demands differ as in SGLang: the FULL (anchor) pool evicts the shortfall
        (``_execute_kv_backup``), the SWA pool's reclaim callback the whole request
        (``HostPoolGroup.alloc`` passes ``need_size``), so a short SWA pool frees more.
        """
        pages = pool.alloc_pages(num_pages)
        if pages is None:
            if swa:
                self.evict_host(swa_tokens=num_pages * self.ps)
            else:
                self.evict_host(full_tokens=num_pages * self.ps - pool.available_tokens())
            pages = pool.alloc_pages(num_pages)
        return pages

    def backup(self, node, write_back: bool = False) -> bool:
        """Copy ``node``'s FULL (and, write-through, unbacked ancestors') to the host.

        Args:
            node: a node with device FULL.
            write_back: back up only ``node`` (eviction-time backup).
        Returns:
            True when ``node`` ends up backed up.
        Mutates: host pools (may evict host leaves), node host values.
        """
        if not self.hicache:
            return False
        chain = [node]
        if not write_back:
            cur = node.parent
            while cur is not self.root and cur.full_host is None:
                chain.append(cur)
                cur = cur.parent
            chain.reverse()
        for cur in chain:
            # as SGLang's ``_execute_kv_backup``: the window's SWA nodes are read first, FULL is
            # allocated (evicting the host shortfall), then SWA (its reclaim evicts the whole
            # request); when SWA stays short the FULL pages go back and the chain stops
            swa_nodes = self._swa_window_unbacked(cur)
            pages = None
            if cur.full_host is None:
                if cur.full is None:
                    raise MemoryModelError(f"backup of {cur} without device FULL")
                pages = self._alloc_host(self.host_full, len(cur.key), swa=False)
                if pages is None:
                    break
            if swa_nodes and not self._attach_swa_host(swa_nodes):
                if pages is not None:
                    self.host_full.free_pages(pages)
                break
            if pages is not None:
                self._set_full_host(cur, pages)
                self._update_leaf_sets(cur)
            if (pages is not None or swa_nodes) and not write_back:
                self._write_through_pending(cur, swa_nodes)
        return node.full_host is not None

    def backup_incremental(self, node) -> int:
        """Write-through of an insert that ends on an existing backed-up node: the SWA its
        window still lacks on the host (none while the node's own write-through is pending).

        Returns:
            SWA tokens copied to the host.
        """
        if node.wt_pending is not None:
            return 0
        swa_nodes = self._backup_swa_nodes(node)
        if swa_nodes:
            self._write_through_pending(node, swa_nodes)
        return sum(len(n.key) for n in swa_nodes) * self.ps

    def _write_through_pending(self, node, swa_nodes) -> None:
        """Hold a committed write-through until its acknowledgement (deferred acks only)."""
        if not self.defer_write_ack:
            return
        ack, self._next_ack = self._next_ack, self._next_ack + 1
        covered = list(swa_nodes)
        if node not in covered:
            covered.append(node)
        for cur in covered:
            cur.wt_pending = ack
        self._wt_acks[ack] = (self.lock(node), covered)

    def ack_write_through(self) -> int:
        """Acknowledge every pending write-through, oldest first: clear the pending marks
        and release the locks (SGLang ``writing_check`` at the next scheduler step).

        Returns:
            the number of acknowledgements.
        Mutates: node pending marks, lock counts, ledgers, leaf sets.
        """
        acks, self._wt_acks = self._wt_acks, {}
        for ack, (receipt, covered) in acks.items():
            for cur in covered:
                if cur.wt_pending == ack:
                    cur.wt_pending = None
            self.unlock(receipt)
        return len(acks)

    def _backup_swa_nodes(self, node) -> list:
        """Back up the window's unbacked device SWA; return the nodes copied, oldest first."""
        todo = self._swa_window_unbacked(node)
        return todo if todo and self._attach_swa_host(todo) else []

    def _swa_window_unbacked(self, node) -> list:
        """Nodes within one window above ``node`` with device SWA and no host copy, oldest
        first (SGLang ``_collect_unbacked_swa_nodes_in_window``)."""
        if self.host_swa is None:
            return []
        covered, cur, todo = 0, node, []
        while cur is not self.root and covered < self.window_tokens:
            if cur.wt_pending is not None:
                break
            if cur.swa is None and cur.swa_host is None:
                break
            covered += len(cur.key) * self.ps
            if cur.swa is not None and cur.swa_host is None:
                todo.append(cur)
            cur = cur.parent
        todo.reverse()
        return todo

    def _attach_swa_host(self, todo: list) -> bool:
        """Copy the SWA of ``todo`` to the host in one allocation; False when it stays short."""
        pages = self._alloc_host(self.host_swa, sum(len(cur.key) for cur in todo), swa=True)
        if pages is None:
            return False
        pos = 0
        for cur in todo:
            if cur.swa_host is not None or cur.swa is None:  # host eviction cannot reach it; defensive
                raise MemoryModelError("SWA window changed during its backup")
            k = len(cur.key)
            self._set_swa_host(cur, pages[pos : pos + k])
            pos += k
        return True

    def load_back(self, node) -> int | None:
        """Bring host-only FULL (and SWA within one window) above ``node`` back to device.

        Args:
            node: the best match node of a match.
        Returns:
            FULL tokens loaded (0 for an SWA-only restore), or None when nothing was loaded
            (no host hit, below the threshold, or the device pools stayed short).
        Mutates: device pools (may evict: the evictions are kept in ``load_back_evicted``),
        node values and ledgers.
        """
        if not self.hicache or node is self.root:
            return None
        full_nodes, cur = [], node
        while cur is not self.root and cur.full is None:
            if cur.full_host is None:
                raise MemoryModelError(f"load_back through {cur} without a host copy")
            full_nodes.append(cur)
            cur = cur.parent
        full_nodes.reverse()
        swa_nodes = []
        if self.swa_tree:
            covered, cur = 0, node
            while cur is not self.root and covered < self.window_tokens:
                if cur.swa is None:
                    if cur.swa_host is None:
                        break
                    swa_nodes.append(cur)
                covered += len(cur.key) * self.ps
                cur = cur.parent
        kv_pages = sum(len(n.key) for n in full_nodes)
        swa_pages = sum(len(n.key) for n in swa_nodes)
        self.load_back_evicted = []
        if kv_pages * self.ps < max(1, self.load_back_threshold_tokens) and not swa_nodes:
            return None
        receipt = self.lock(node)
        self._host_pinned = set(swa_nodes)
        try:
            return self._load(full_nodes, swa_nodes, kv_pages, swa_pages)
        finally:
            self._host_pinned = set()
            self.unlock(receipt)

    def _load(self, full_nodes, swa_nodes, kv_pages: int, swa_pages: int) -> int | None:
        pools, ps = self.pools, self.ps
        full_short = kv_pages * ps - pools.full.available_tokens()
        if full_short > 0:
            self.load_back_evicted.append(self.evict(full_tokens=full_short))
        if swa_pages and pools.swa.available_tokens() < swa_pages * ps:
            self.load_back_evicted.append(self.evict(swa_tokens=swa_pages * ps - pools.swa.available_tokens()))
        if pools.full.available_pages() < kv_pages:
            return None
        if swa_pages and pools.swa.available_pages() < swa_pages:
            return None
        new = pools.full.alloc_pages(kv_pages).tolist() if kv_pages else []
        pos = 0
        for cur in full_nodes:
            k = len(cur.key)
            self._set_full(cur, new[pos : pos + k])
            pos += k
        for cur in swa_nodes:
            self._set_swa(cur, pools.alloc_swa_for(cur.full))
        for cur in full_nodes:
            self._update_leaf_sets(cur)
            self._update_leaf_sets(cur.parent)
        return kv_pages * ps
