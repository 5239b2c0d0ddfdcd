"""Persistent eviction heaps over the tree's evictable leaves (lazy invalidation).

SGLang rebuilds a heap over every evictable leaf on each eviction (O(leaves)). The model keeps
one heap per tier instead and re-pushes a leaf whenever the tree changes a field a policy may
rank by; stale entries (an older version, or a node that is no longer a leaf) are skipped on
pop, and the heap is rebuilt when stale entries outnumber live ones. The order of victims is
the same as ranking all leaves at eviction time; the cost is O(log leaves) per touched leaf.
"""

from __future__ import annotations

import heapq


class LeafHeap:
    """Min-heap of ``(policy priority, last_access, id, version, node)`` over a leaf set.

    Args:
        policy: object with ``priority(node) -> tuple``.
        members: the tree's live leaf set for this tier (shared, not copied).
        slot: which version counter of the node this heap uses (0 device, 1 host).
    """

    def __init__(self, policy, members: set, slot: int):
        self.policy = policy
        self.members = members
        self.slot = slot
        self.heap: list = []

    def push(self, node) -> None:
        """(Re-)rank ``node``; older entries for it become stale."""
        ver = node.heap_ver
        ver[self.slot] += 1
        heapq.heappush(
            self.heap,
            (self.policy.priority(node), node.last_access, node.id, ver[self.slot], node),
        )
        if len(self.heap) > 2 * len(self.members) + 64:
            self.rebuild()

    def rebuild(self) -> None:
        """Drop stale entries: one fresh entry per live leaf."""
        slot = self.slot
        entries = []
        for node in self.members:
            node.heap_ver[slot] += 1
            entries.append(
                (self.policy.priority(node), node.last_access, node.id, node.heap_ver[slot], node)
            )
        heapq.heapify(entries)
        self.heap = entries

    def pop(self):
        """The lowest-ranked live leaf (removed from the heap), or None."""
        heap, members, slot = self.heap, self.members, self.slot
        while heap:
            entry = heapq.heappop(heap)
            node = entry[-1]
            if node in members and entry[3] == node.heap_ver[slot]:
                return node
        return None

    def __len__(self) -> int:
        return len(self.heap)
