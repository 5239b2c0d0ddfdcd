"""HiCache for the radix tree: backups, load-back (DESIGN.md §4.3).

Transfers are modelled as instantaneous: a backup commits its host copy at once and a
load-back its device copy (SGLang's acks, in-flight pins and TP consensus are not modelled).

* ``write_through`` / ``write_through_selective``: an insert that raises a node's hit count to
  the threshold backs the node and its unbacked ancestors up (ancestors first);
* ``write_back``: a node is backed up only when FULL eviction reaches it;
* a backup also copies the device SWA of unbacked nodes within one window above the node;
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
        pages = pool.alloc_pages(num_pages)
        if pages is None:
            need = num_pages * self.ps - pool.available_tokens()
            if swa:
                self.evict_host(swa_tokens=need)
            else:
                self.evict_host(full_tokens=need)
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
        ok = True
        for cur in chain:
            if cur.full_host is None:
                if cur.full is None:
                    raise MemoryModelError(f"backup of {cur} without device FULL")
                pages = self._alloc_host(self.host_full, len(cur.key), swa=False)
                if pages is None:
                    ok = False
                    break
                self._set_full_host(cur, pages)
                self._update_leaf_sets(cur)
            self.backup_swa_window(cur)
        return ok and node.full_host is not None

    def backup_swa_window(self, node) -> int:
        """Back up device SWA of unbacked nodes within one window above ``node``.

        Returns:
            SWA tokens copied to the host.
        Mutates: SWA host pool, node ``swa_host``.
        """
        if self.host_swa is None:
            return 0
        covered, cur, todo = 0, node, []
        while cur is not self.root and covered < self.window_tokens:
            if cur.swa is None and cur.swa_host is None:
                break
            covered += len(cur.key) * self.ps
            if cur.swa is not None and cur.swa_host is None:
                todo.append(cur)
            cur = cur.parent
        copied = 0
        for cur in reversed(todo):
            pages = self._alloc_host(self.host_swa, len(cur.key), swa=True)
            if pages is None:
                break
            if cur.swa_host is not None:  # host eviction cannot reach it; defensive
                raise MemoryModelError("SWA host copy appeared during backup")
            self._set_swa_host(cur, pages)
            copied += len(pages) * self.ps
        return copied

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
