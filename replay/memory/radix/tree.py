"""Radix tree core: state, ledgers, deferred frees, split and leaf sets (DESIGN.md §4.3).

Match, insert, locks, eviction, HiCache and integrity live in mixins (one module each).

Keys are page hashes (one int per page); values are page ids. The tree never touches torch
except through its pools (frees, SWA translation). All times come from ``self.clock``, a
logical float counter advanced by the tree.
"""

from __future__ import annotations

from replay.memory.policies import POLICIES
from replay.memory.radix.evict import EvictMixin
from replay.memory.radix.heap import LeafHeap
from replay.memory.radix.hicache import HiCacheMixin
from replay.memory.radix.insert import InsertMixin
from replay.memory.radix.integrity import IntegrityMixin
from replay.memory.radix.locks import LockMixin, TreeLock
from replay.memory.radix.match import MatchMixin, void_memos
from replay.memory.radix.node import DEVICE_LRU, HOST_LRU, LRUList, Node
from replay.memory.results import MemoryModelError


class RadixTree(MatchMixin, InsertMixin, EvictMixin, HiCacheMixin, LockMixin, IntegrityMixin):
    """FULL (+ optional SWA) radix tree over page-hash keys.

    Args:
        pools: ``PlainKVPools`` or ``SWAKVPools`` the tree frees into.
        page_size: tokens per page.
        window_tokens: SWA retain window W (0 = no SWA component).
        swa_component: track SWA in the tree (False for the EIC cache, whose tree owns FULL
            only even though the pools have an SWA side).
        eviction: FULL eviction policy name or import path.
        swa_lru_refresh: ``full_ancestry`` | ``window_aware``.
        host_full / host_swa: HiCache host pools (None = no HiCache).
        write_policy: ``write_through`` | ``write_through_selective`` | ``write_back``.
        write_through_threshold: hit count that triggers a write-through backup.
        load_back_threshold_tokens: host hits smaller than this are not loaded back.
        defer_write_ack: a write-through backup locks its node and stays pending until
            ``ack_write_through`` (SGLang's acknowledgement at the next scheduler step);
            False acknowledges it at once.
    """

    def __init__(
        self,
        pools,
        page_size: int,
        window_tokens: int = 0,
        swa_component: bool = True,
        eviction: str = "lru",
        swa_lru_refresh: str = "window_aware",
        host_full=None,
        host_swa=None,
        write_policy: str = "write_through",
        write_through_threshold: int = 1,
        load_back_threshold_tokens: int = 10,
        defer_write_ack: bool = False,
    ):
        self.pools = pools
        self.ps = page_size
        self.window_tokens = window_tokens
        self.swa_tree = bool(swa_component and pools.has_swa and window_tokens > 0)
        self.policy = POLICIES.create(eviction)
        self.window_aware = swa_lru_refresh == "window_aware"
        self.host_full = host_full
        self.host_swa = host_swa if self.swa_tree else None
        self.hicache = host_full is not None
        self.write_back = write_policy == "write_back"
        self.write_through_threshold = write_through_threshold
        self.load_back_threshold_tokens = load_back_threshold_tokens
        self.defer_write_ack = defer_write_ack
        self._wt_acks: dict[int, tuple] = {}  # ack id -> (lock receipt, nodes marked pending)
        self._next_ack = 0
        self.load_back_evicted: list = []  # the EvictResults of the last load_back's device room
        self.clock = 0.0
        # bumped by every change a match walk reads (children, keys, which components a node
        # holds, a node's FULL value list); each such change but a new leaf also stamps the
        # node it changed with the new value (``Node.mod``: the node whose key or values
        # changed, or that left its parent's children), so a walk memo (``GrowingKeys.walks``)
        # is valid while no node the walk read has a later stamp and the node it stopped under
        # for want of a child still has none for that page
        self.version = 0
        self._next_node_id = 0
        self._next_uuid = 0
        self.root = self._new_node([], None)
        self.root.full = []
        self.root.swa = []
        self.num_nodes = 0
        self.full_evictable = self.full_protected = 0
        self.swa_evictable = self.swa_protected = 0
        self.host_full_tokens = self.host_swa_tokens = 0
        self.device_leaves: set[Node] = set()
        self.host_leaves: set[Node] = set()
        self.device_heap = LeafHeap(self.policy, self.device_leaves, 0)
        self.host_heap = LeafHeap(self.policy, self.host_leaves, 1)
        self.swa_lru = LRUList(DEVICE_LRU)
        self.swa_host_lru = LRUList(HOST_LRU)
        self._host_pinned: set[Node] = set()  # host copies being loaded back
        self._swa_chunks: list[list[int]] = []  # deferred device frees, flushed per op
        self._full_chunks: list[list[int]] = []
        self._pending_swa_pages = self._pending_full_pages = 0

    # ---- clock and nodes ---------------------------------------------------------------

    def tick(self) -> float:
        """Advance the logical clock by one and return the old value."""
        t = self.clock
        self.clock = t + 1.0
        return t

    def _new_node(self, key: list[int], parent: Node | None) -> Node:
        now = self.clock
        self.clock += 2.0  # last_access, then creation_time (as SGLang stamps a new node)
        node = Node(self._next_node_id, key, parent, now)
        self._next_node_id += 1
        return node

    def _changed(self, node: Node) -> None:
        """Bump ``version`` and stamp ``node`` with it (``Node.mod``): a change a match walk reads
        of ``node`` (its key, which components it holds, its FULL list, its removal); the walk
        memos that read it are void."""
        self.version += 1
        node.mod = self.version
        watch = node.watch
        if watch is not None:
            node.watch = None
            void_memos(watch)

    # ---- ledger-keeping setters --------------------------------------------------------

    def _set_full(self, node: Node, pages: list[int]) -> None:
        self._changed(node)
        node.full = pages
        node.parent.dev_children += 1
        n = len(pages) * self.ps
        if node.full_lock > 0:
            self.full_protected += n
        else:
            self.full_evictable += n

    def _take_full(self, node: Node) -> list[int]:
        self._changed(node)
        pages, node.full = node.full, None
        node.parent.dev_children -= 1
        n = len(pages) * self.ps
        if node.full_lock > 0:
            self.full_protected -= n
        else:
            self.full_evictable -= n
        return pages

    def _set_swa(self, node: Node, pages: list[int]) -> None:
        self._changed(node)
        node.swa = pages
        n = len(pages) * self.ps
        if node.swa_lock > 0:
            self.swa_protected += n
        else:
            self.swa_evictable += n
        if node in self.swa_host_lru:
            self.swa_host_lru.remove(node)
        self.swa_lru.insert_mru(node)

    def _take_swa(self, node: Node, to_host_lru: bool = True) -> list[int]:
        self._changed(node)
        pages, node.swa = node.swa, None
        n = len(pages) * self.ps
        if node.swa_lock > 0:
            self.swa_protected -= n
        else:
            self.swa_evictable -= n
        self.swa_lru.remove(node)
        if to_host_lru and node.swa_host is not None:
            self.swa_host_lru.insert_mru(node)
        return pages

    def _set_full_host(self, node: Node, pages: list[int]) -> None:
        self._changed(node)
        node.full_host = pages
        self.host_full_tokens += len(pages) * self.ps

    def _take_full_host(self, node: Node) -> list[int]:
        self._changed(node)
        pages, node.full_host = node.full_host, None
        self.host_full_tokens -= len(pages) * self.ps
        return pages

    def _set_swa_host(self, node: Node, pages: list[int]) -> None:
        self._changed(node)
        node.swa_host = pages
        self.host_swa_tokens += len(pages) * self.ps
        if node.swa is None:
            self.swa_host_lru.insert_mru(node)

    def _take_swa_host(self, node: Node) -> list[int]:
        self._changed(node)
        pages, node.swa_host = node.swa_host, None
        self.host_swa_tokens -= len(pages) * self.ps
        if node in self.swa_host_lru:
            self.swa_host_lru.remove(node)
        return pages

    # ---- deferred device frees ----------------------------------------------------------
    # A public op collects its device frees and releases them once at its end, per side in
    # the order SGLang would (the free lists end up identical); loops that wait for room
    # count the pending pages as available.

    def _defer_swa(self, full_pages: list[int]) -> None:
        """Queue freeing the SWA peers of ``full_pages`` (mapping read at flush)."""
        if not full_pages or not self.pools.has_swa:
            return
        self._swa_chunks.append(full_pages)
        if self.swa_tree:
            self._pending_swa_pages += len(full_pages)
        else:
            self._pending_swa_pages += sum(1 for s in self.pools.translate(full_pages) if s)

    def _defer_full(self, pages: list[int]) -> None:
        """Queue freeing full pages (their SWA must be queued before or gone)."""
        if pages:
            self._full_chunks.append(pages)
            self._pending_full_pages += len(pages)

    def _flush(self) -> None:
        """Release queued device frees: SWA side first, then full (one call each)."""
        if self._swa_chunks:
            chunks, self._swa_chunks = self._swa_chunks, []
            self.pools.free_swa_chunks(chunks)
        if self._full_chunks:
            chunks, self._full_chunks = self._full_chunks, []
            # straight to the full allocator: the tree frees a node's SWA side before its full
            # side, so ``free_full_chunks``'s per-page peer check (~4 % of a replay on this path)
            # would find nothing; ``check_integrity`` checks that no free full page keeps a peer
            self.pools.full.free_page_chunks(chunks)
        self._pending_swa_pages = self._pending_full_pages = 0

    def full_available_tokens(self) -> int:
        """Free full slots including this op's queued frees."""
        return (self.pools.full.available_pages() + self._pending_full_pages) * self.ps

    def swa_available_tokens(self) -> int:
        """Free SWA slots including this op's queued frees."""
        return self.pools.swa_available_tokens() + self._pending_swa_pages * self.ps

    def _free_full_device(self, pages: list[int]) -> None:
        """Free full pages whose tree-tracked SWA is already gone (EIC: peers go along)."""
        if not self.swa_tree:
            self._defer_swa(pages)
        self._defer_full(pages)

    # ---- leaf sets ---------------------------------------------------------------------

    def _is_device_leaf(self, node: Node) -> bool:
        return not (
            node.full is None or node.full_lock or node.swa_lock or node.dev_children
            or node is self.root
        )

    def _is_host_leaf(self, node: Node) -> bool:
        return (
            node is not self.root
            and node.full is None
            and node.full_host is not None
            and not node.full_lock
            and not node.swa_lock
            and not node.children
        )

    def _update_leaf_sets(self, node: Node) -> None:
        # ``_is_device_leaf`` and ``_is_host_leaf`` inlined (~700 k calls an hour of traffic): a
        # node with device FULL is never a host leaf, one without is never a device leaf
        if node.full is not None:
            if node.full_lock or node.swa_lock or node.dev_children or node is self.root:
                self.device_leaves.discard(node)
            elif node not in self.device_leaves:
                self.device_leaves.add(node)
                self.device_heap.push(node)
            if self.host_leaves:
                self.host_leaves.discard(node)
            return
        self.device_leaves.discard(node)
        if node.full_host is not None and not (node.full_lock or node.swa_lock or node.children) \
                and node is not self.root:
            if node not in self.host_leaves:
                self.host_leaves.add(node)
                self.host_heap.push(node)
        elif self.host_leaves:
            self.host_leaves.discard(node)

    def _touch_leaf(self, node: Node) -> None:
        """Re-rank ``node`` after a change to a field a policy may read."""
        if node in self.device_leaves:
            self.device_heap.push(node)
        elif node in self.host_leaves:
            self.host_heap.push(node)

    # ---- structure ---------------------------------------------------------------------

    def _split(self, child: Node, num_pages: int) -> Node:
        """Split ``child`` after ``num_pages`` pages; return the new (older) parent.

        The child object keeps the newer part; locks are copied to both halves and the SWA
        lock boundary uuid moves to the new parent (it marks the segment's older edge).
        """
        self.version += 1
        parent = child.parent
        new = self._new_node(child.key[:num_pages], parent)
        new.creation_time = child.creation_time
        new.hit_count = child.hit_count
        new.priority = child.priority
        new.full_lock = child.full_lock
        new.swa_lock = child.swa_lock
        new.swa_uuid, child.swa_uuid = child.swa_uuid, None
        if child.wt_pending is not None:  # both halves stay pending under the same ack
            new.wt_pending = child.wt_pending
            self._wt_acks[child.wt_pending][1].append(new)
        new.dev_children = 1 if child.full is not None else 0
        for attr in ("full", "swa", "full_host", "swa_host"):
            value = getattr(child, attr)
            if value is not None:
                setattr(new, attr, value[:num_pages])
                setattr(child, attr, value[num_pages:])
        child.key = child.key[num_pages:]
        new.children = {child.key[0]: child}
        child.parent = new
        parent.children[new.key[0]] = new
        # walk-visible changes: the child's key and values, the new node (the parent's entry
        # for the first page now leads to ``new``: a walk that took it read ``child``)
        child.mod = new.mod = self.version
        watch = child.watch
        if watch is not None:
            child.watch = None
            void_memos(watch)
        if new.swa is not None:
            self.swa_lru.insert_after(child, new)
        elif new.swa_host is not None:
            if child in self.swa_host_lru:
                self.swa_host_lru.insert_after(child, new)
            else:
                self.swa_host_lru.insert_mru(new)
        child.last_access = self.tick()
        self.num_nodes += 1
        self._update_leaf_sets(new)
        self._update_leaf_sets(child)
        self._touch_leaf(child)
        return new

    def _add_leaf(self, parent: Node, key: list[int], pages: list[int], priority: int) -> Node:
        self.version += 1
        node = self._new_node(key, parent)
        node.priority = priority
        parent.children[key[0]] = node
        # no stamp: only the walk memos that found no child here for this page are void
        ends = parent.end_watch
        if ends is not None:
            watch = ends.pop(key[0], None)
            if watch is not None:
                void_memos(watch)
        self._set_full(node, pages)
        self.num_nodes += 1
        self._update_leaf_sets(node)
        self._update_leaf_sets(parent)
        return node

    def path_pages(self, node: Node) -> list[int]:
        """Device full pages from the root down to ``node`` (all must be on device)."""
        return self.path_pages_from(node, 0)

    def path_pages_from(self, node: Node, lo: int) -> list[int]:
        """``path_pages(node)[lo:]``, copying only the nodes that hold those pages (a
        checkpoint replaces only the pages past what the request already had in the tree).

        Raises:
            MemoryModelError: a node on the path is not on device."""
        chunks, depth = [], 0
        cur = node
        while cur is not self.root:
            if cur.full is None:
                raise MemoryModelError(f"path_pages: {cur} is not on device")
            chunks.append(cur.full)
            depth += len(cur.full)
            cur = cur.parent
        pos, need = depth, []  # ``chunks`` is leaf first: keep those that end after ``lo``
        for chunk in chunks:
            if pos <= lo:
                break
            pos -= len(chunk)
            need.append(chunk)
        out: list[int] = []
        for chunk in reversed(need):
            out.extend(chunk)
        return out[lo - pos:] if lo > pos else out

    def node_tokens(self, node: Node) -> int:
        """Tokens in ``node``'s key."""
        return len(node.key) * self.ps


__all__ = ["RadixTree", "TreeLock"]
