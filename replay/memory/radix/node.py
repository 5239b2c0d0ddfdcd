"""Tree node and the intrusive LRU list used by the SWA component (device and host tiers)."""

from __future__ import annotations

from collections.abc import Iterator

DEVICE_LRU = 0
HOST_LRU = 1


class Node:
    """One radix-tree node.

    The key is a list of page hashes (one int per page). Values are lists of page ids, one per
    key page: ``full`` / ``swa`` on device, ``full_host`` / ``swa_host`` on the host pools;
    None means the component is absent on that tier. A node with ``full`` but no ``swa`` is an
    SWA tombstone. ``last_access`` and ``creation_time`` come from the tree's logical clock.
    ``mod`` stamps the last change a match walk would see (``RadixTree.version``).
    """

    __slots__ = (
        "id", "parent", "children", "key", "full", "swa", "full_host", "swa_host",
        "full_lock", "swa_lock", "swa_uuid", "last_access", "creation_time", "hit_count",
        "priority", "lru_prev", "lru_next", "heap_ver", "dev_children", "wt_pending", "mod", "watch", "end_watch",
    )

    def __init__(self, node_id: int, key: list[int], parent: Node | None, now: float):
        self.id = node_id
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.key = key
        self.full: list[int] | None = None
        self.swa: list[int] | None = None
        self.full_host: list[int] | None = None
        self.swa_host: list[int] | None = None
        self.full_lock = 0
        self.swa_lock = 0
        self.swa_uuid: int | None = None
        self.last_access = now
        self.creation_time = now + 1.0
        self.hit_count = 0
        self.priority = 0
        self.lru_prev: list[Node | None] = [None, None]
        self.lru_next: list[Node | None] = [None, None]
        self.heap_ver = [0, 0]  # entry versions in the device / host leaf heaps
        self.dev_children = 0  # children with device FULL (O(1) device-leaf test)
        self.wt_pending: int | None = None  # ack id of a write-through not yet acknowledged
        # ``RadixTree.version`` of the last change to what a match walk reads of this node (its
        # key, which components it holds, its FULL list) or of its removal from the tree: a
        # walk memo that read the node is valid while this is at most the memo's version
        self.mod = 0
        # the walk memos that read this node (``GrowingKeys.walks`` entries), voided by the
        # node's next change (``RadixTree._changed``); and, by page, those that stopped under it
        # for want of a child for that page, voided when such a child is added (``_add_leaf``)
        self.watch: list | None = None
        self.end_watch: dict | None = None

    @property
    def num_pages(self) -> int:
        """Pages in the key."""
        return len(self.key)

    def __repr__(self) -> str:
        flags = "".join(
            c for c, v in (("F", self.full), ("S", self.swa), ("f", self.full_host), ("s", self.swa_host))
            if v is not None
        )
        return f"Node({self.id}, pages={len(self.key)}, {flags or '-'}, lock={self.full_lock}/{self.swa_lock})"


class _Sentinel:
    __slots__ = ("lru_prev", "lru_next", "swa_lock")

    def __init__(self) -> None:
        self.lru_prev: list = [None, None]
        self.lru_next: list = [None, None]
        self.swa_lock = 0


class LRUList:
    """Doubly linked recency list threaded through the nodes (O(1) moves).

    ``head`` is the MRU end, ``tail`` the LRU end. ``k`` selects which link slot of the node
    this list uses (device or host SWA).
    """

    def __init__(self, k: int):
        self.k = k
        self.head = _Sentinel()
        self.tail = _Sentinel()
        self.head.lru_next[k] = self.tail
        self.tail.lru_prev[k] = self.head
        self.size = 0

    def __contains__(self, node: Node) -> bool:
        return node.lru_prev[self.k] is not None

    def _link_after(self, prev, node: Node) -> None:
        k = self.k
        nxt = prev.lru_next[k]
        node.lru_prev[k] = prev
        node.lru_next[k] = nxt
        prev.lru_next[k] = node
        nxt.lru_prev[k] = node
        self.size += 1

    def remove(self, node: Node) -> None:
        """Unlink ``node`` (it must be in the list)."""
        k = self.k
        prev, nxt = node.lru_prev[k], node.lru_next[k]
        prev.lru_next[k] = nxt
        nxt.lru_prev[k] = prev
        node.lru_prev[k] = node.lru_next[k] = None
        self.size -= 1

    def insert_mru(self, node: Node) -> None:
        """Put ``node`` at the MRU end (moving it if present)."""
        if node.lru_prev[self.k] is not None:
            self.remove(node)
        self._link_after(self.head, node)

    def insert_after(self, prev: Node, node: Node) -> None:
        """Put ``node`` just older than ``prev``."""
        if node.lru_prev[self.k] is not None:
            self.remove(node)
        self._link_after(prev, node)

    def move_chain_to_mru(self, nodes: list[Node]) -> None:
        """Move ``nodes`` to the MRU end keeping their order (first = most recent); a node already
        right after the one before it stays (a refresh's chain is often where the last one put it)."""
        k = self.k
        prev = self.head
        for node in nodes:
            links = node.lru_prev
            before = links[k]
            if before is prev:
                prev = node
                continue
            if before is not None:  # unlinked from where it is
                after = node.lru_next[k]
                before.lru_next[k] = after
                after.lru_prev[k] = before
            else:
                self.size += 1
            nxt = prev.lru_next[k]
            links[k] = prev
            node.lru_next[k] = nxt
            prev.lru_next[k] = node
            nxt.lru_prev[k] = node
            prev = node

    def lru(self) -> Node | None:
        """Least recently used node whose SWA lock is 0, or None."""
        return self.prev_unlocked(self.tail)

    def prev_unlocked(self, node) -> Node | None:
        """Next older node than ``node`` whose SWA lock is 0 (device list) or any (host list)."""
        k = self.k
        x = node.lru_prev[k]
        if k == DEVICE_LRU:
            while x is not self.head and x.swa_lock > 0:
                x = x.lru_prev[k]
        return None if x is self.head else x

    def __iter__(self) -> Iterator[Node]:
        """MRU → LRU."""
        k = self.k
        x = self.head.lru_next[k]
        while x is not self.tail:
            yield x
            x = x.lru_next[k]

    def check_links(self) -> int:
        """Walk both directions; return the length. Raises AssertionError on a broken link."""
        k = self.k
        n, x = 0, self.head
        while x.lru_next[k] is not self.tail:
            nxt = x.lru_next[k]
            assert nxt.lru_prev[k] is x, "LRU back link broken"
            x, n = nxt, n + 1
        assert self.tail.lru_prev[k] is x, "LRU tail link broken"
        assert n == self.size, f"LRU size {self.size} != walked {n}"
        return n
