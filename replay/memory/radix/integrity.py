"""``check_integrity()`` for the radix tree: a full walk compared with the incremental state."""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.memory.results import IntegrityError


@dataclass
class TreeCensus:
    """Every page id the tree owns, per pool (for the model's no-slot-in-two-places check)."""

    full: list[int] = field(default_factory=list)
    swa: list[int] = field(default_factory=list)
    host_full: list[int] = field(default_factory=list)
    host_swa: list[int] = field(default_factory=list)


def _fail(msg: str) -> None:
    raise IntegrityError(msg)


class IntegrityMixin:
    """Integrity half of ``RadixTree``."""

    def _walk(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> TreeCensus:
        """Recompute ledgers, leaf sets, LRU membership and structure from a full walk.

        Checks: parent/child links and keys; value lengths; walk stamps (``mod``) not ahead of
        the version; locks >= 0 and FULL locks nested;
        device FULL top-connected; no dead nodes; SWA only with FULL; evictable/protected
        ledgers; device/host leaf sets; SWA LRU lists; full→SWA mapping of every node; no page
        owned twice inside the tree.

        Returns:
            TreeCensus of the page ids the tree owns.
        Raises:
            IntegrityError: on the first inconsistency.
        """
        ps, census = self.ps, TreeCensus()
        if self._swa_chunks or self._full_chunks:
            _fail("device frees still queued between operations")
        full_ev = full_prot = swa_ev = swa_prot = host_full = host_swa = 0
        dev_leaves, host_leaves, in_lru, in_host_lru = set(), set(), set(), set()
        nodes = 0
        for node in self._walk():
            nodes += 1
            self._check_node_shape(node)
            n = len(node.key) * ps
            if node.full is not None:
                census.full.extend(node.full)
                if node.full_lock:
                    full_prot += n
                else:
                    full_ev += n
            if node.swa is not None:
                census.swa.extend(node.swa)
                in_lru.add(node)
                if node.swa_lock:
                    swa_prot += n
                else:
                    swa_ev += n
            if node.full_host is not None:
                census.host_full.extend(node.full_host)
                host_full += n
            if node.swa_host is not None:
                census.host_swa.extend(node.swa_host)
                host_swa += n
                if node.swa is None:
                    in_host_lru.add(node)
            if self._is_device_leaf(node):
                dev_leaves.add(node)
            if self._is_host_leaf(node):
                host_leaves.add(node)
        if self.root.dev_children != sum(1 for c in self.root.children.values() if c.full is not None):
            _fail("root device-children count drifted")
        if self.root.mod > self.version:
            _fail("the root's walk stamp is ahead of the tree version")
        self._check_end_watch(self.root)
        if nodes != self.num_nodes:
            _fail(f"node count {self.num_nodes} != walked {nodes}")
        for name, got, want in (
            ("full_evictable", self.full_evictable, full_ev),
            ("full_protected", self.full_protected, full_prot),
            ("swa_evictable", self.swa_evictable, swa_ev),
            ("swa_protected", self.swa_protected, swa_prot),
            ("host_full_tokens", self.host_full_tokens, host_full),
            ("host_swa_tokens", self.host_swa_tokens, host_swa),
        ):
            if got != want:
                _fail(f"ledger {name}={got} but a full walk gives {want}")
        if dev_leaves != self.device_leaves:
            _fail(f"device leaf set drifted: {self.device_leaves ^ dev_leaves}")
        if host_leaves != self.host_leaves:
            _fail(f"host leaf set drifted: {self.host_leaves ^ host_leaves}")
        self._check_heap(self.device_heap)
        self._check_heap(self.host_heap)
        try:
            self.swa_lru.check_links()
            self.swa_host_lru.check_links()
        except AssertionError as e:
            _fail(str(e))
        if set(self.swa_lru) != in_lru:
            _fail("SWA LRU membership != nodes with device SWA")
        if set(self.swa_host_lru) != in_host_lru:
            _fail("SWA host LRU membership != host-only SWA nodes")
        for pool, pages in (("full", census.full), ("swa", census.swa),
                            ("host_full", census.host_full), ("host_swa", census.host_swa)):
            if len(set(pages)) != len(pages):
                _fail(f"a {pool} page is owned by two tree nodes")
            if pool in ("full", "swa") and 0 in pages:
                _fail(f"reserved {pool} page 0 is in the tree")
        self._check_mapping(census)
        return census

    def _check_heap(self, heap) -> None:
        """Every live leaf has a current heap entry ranked with its current fields."""
        current = {}
        for entry in heap.heap:
            node = entry[-1]
            if entry[3] == node.heap_ver[heap.slot]:
                current[node] = entry
        for node in heap.members:
            entry = current.get(node)
            if entry is None:
                _fail(f"{node}: evictable leaf missing from the eviction heap")
            if entry[0] != self.policy.priority(node) or entry[1] != node.last_access:
                _fail(f"{node}: eviction heap ranks it with stale fields")

    def _check_node_shape(self, node) -> None:
        root = self.root
        parent = node.parent
        if not node.key or parent is None or parent.children.get(node.key[0]) is not node:
            _fail(f"{node}: broken parent/child link or empty key")
        k = len(node.key)
        for attr in ("full", "swa", "full_host", "swa_host"):
            value = getattr(node, attr)
            if value is not None and len(value) != k:
                _fail(f"{node}: {attr} has {len(value)} pages for a {k}-page key")
        if node.dev_children != sum(1 for c in node.children.values() if c.full is not None):
            _fail(f"{node}: device-children count drifted")
        if node.mod > self.version:
            _fail(f"{node}: walk stamp {node.mod} is ahead of the tree version {self.version}")
        self._check_end_watch(node)
        if node.full_lock < 0 or node.swa_lock < 0:
            _fail(f"{node}: negative lock count")
        if sum(c.full_lock for c in node.children.values()) > node.full_lock:
            _fail(f"{node}: children hold more FULL locks than the node")
        if node.full is None and node.full_host is None:
            _fail(f"{node}: dead node (no FULL on either tier) left in the tree")
        if node.full is not None and parent is not root and parent.full is None:
            _fail(f"{node}: device FULL below a device-evicted parent")
        if node.swa is not None and node.full is None:
            _fail(f"{node}: device SWA without device FULL")
        if not self.swa_tree and (node.swa is not None or node.swa_lock or node.swa_host):
            _fail(f"{node}: SWA state in a tree without an SWA component")

    def _check_end_watch(self, node) -> None:
        """No live walk memo says ``node`` lacks a child it has (``Node.end_watch``)."""
        ends = node.end_watch
        if not ends:
            return
        for page, memos in ends.items():
            if page in node.children and any(m[0] is self for m in memos):
                _fail(f"{node}: a live walk memo stopped here for want of the child it has for page {page}")

    def _check_mapping(self, census: TreeCensus) -> None:
        if not self.swa_tree:
            return
        full, swa = [], []
        for node in self._walk():
            if node.full is not None:
                full.extend(node.full)
                swa.extend(node.swa if node.swa is not None else [0] * len(node.full))
        if full and self.pools.translate(full) != swa:
            _fail("full→SWA mapping disagrees with a node's SWA value (or a tombstone is mapped)")
