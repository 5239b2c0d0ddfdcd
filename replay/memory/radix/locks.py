"""Tree locks: FULL from a node to the root, SWA one window up (DESIGN.md §4.3).

A running request locks its FULL path to the root and its SWA path only up to the node where
one window (W tokens, tombstones included) is covered; that boundary node carries a uuid so the
release walks back exactly the same segment even after splits (a split moves the uuid to the
new, older half). Locked tokens are protected, unlocked cached tokens evictable.
"""

from __future__ import annotations

from replay.memory.results import MemoryModelError


class TreeLock:
    """Receipt of ``lock``: the anchor node and the SWA segment's boundary uuid."""

    __slots__ = ("node", "swa_uuid", "released")

    def __init__(self, node, swa_uuid: int | None):
        self.node = node
        self.swa_uuid = swa_uuid
        self.released = False


class LockMixin:
    """Lock half of ``RadixTree``."""

    def lock(self, node) -> TreeLock:
        """Lock FULL from ``node`` to the root and SWA up to one window above ``node``.

        Returns:
            the receipt to pass to ``unlock``.
        Mutates: lock counts, evictable→protected ledgers, leaf sets.
        """
        self._lock_full(node, self.root)
        return TreeLock(node, self._lock_swa(node) if self.swa_tree else None)

    def _lock_full(self, node, stop) -> None:
        """``lock``'s FULL half: FULL-lock from ``node`` up to ``stop`` (the root, or ``relock``'s
        anchor), not including it."""
        ps = self.ps
        cur = node
        while cur is not stop and cur.full is None:  # device-evicted bottom segment
            cur.full_lock += 1
            self._update_leaf_sets(cur)
            cur = cur.parent
        while cur is not stop:
            if cur.full_lock == 0:
                n = len(cur.key) * ps
                self.full_evictable -= n
                self.full_protected += n
            cur.full_lock += 1
            self.device_leaves.discard(cur)
            cur = cur.parent

    def _lock_swa(self, node) -> int | None:
        """``lock``'s SWA half: SWA-lock from ``node`` up until one window is covered; returns the
        boundary node's uuid (None when the path to the root covers less)."""
        root, ps = self.root, self.ps
        uuid = None
        covered, cur, window = 0, node, self.window_tokens
        while cur is not root and covered < window:
            if cur.swa_lock == 0 and cur.swa is not None:
                n = len(cur.key) * ps
                self.swa_evictable -= n
                self.swa_protected += n
            cur.swa_lock += 1
            covered += len(cur.key) * ps
            if covered >= window:
                if cur.swa_uuid is None:
                    self._next_uuid += 1
                    cur.swa_uuid = self._next_uuid
                uuid = cur.swa_uuid
            cur = cur.parent
        return uuid

    def relock(self, receipt: TreeLock, node) -> TreeLock:
        """``lock(node)`` then ``unlock(receipt)`` (a checkpoint moves a request's lock to the node
        its insert ended at). Where the receipt's node is ``node`` or an ancestor of it holding
        device FULL, the FULL walk stops there: above it the lock's +1 and the unlock's -1 on the
        same nodes cancel (each holds the receipt's lock, so neither moves a ledger or a leaf
        set). The SWA halves run as in ``lock`` and ``unlock``.

        Raises:
            MemoryModelError: on a receipt released before.
        Mutates: lock counts, ledgers, leaf sets (as ``lock`` then ``unlock``).
        """
        anchor = receipt.node
        if receipt.released or anchor.full is None or not self._on_path(anchor, node):
            new = self.lock(node)
            self.unlock(receipt)
            return new
        self._lock_full(node, anchor)
        new = TreeLock(node, self._lock_swa(node) if self.swa_tree else None)
        receipt.released = True
        if self.swa_tree:
            self._unlock_swa(receipt)
        return new

    def _on_path(self, anchor, node) -> bool:
        """Whether ``anchor`` is ``node`` or one of its ancestors."""
        root, cur = self.root, node
        while cur is not anchor:
            if cur is root:
                return False
            cur = cur.parent
        return True

    def lock_delta(self, node) -> tuple[int, int]:
        """(FULL, SWA) tokens ``lock(node)`` would move from evictable to protected, without
        locking (the admission check of a request that may be refused reads the locked
        ledgers; a refused request's lock and unlock leave the tree as they found it)."""
        root, ps = self.root, self.ps
        cur = node
        while cur is not root and cur.full is None:
            cur = cur.parent
        full = 0
        while cur is not root:
            if cur.full_lock == 0:
                full += len(cur.key) * ps
            cur = cur.parent
        swa = 0
        if self.swa_tree:
            covered, cur, window = 0, node, self.window_tokens
            while cur is not root and covered < window:
                n = len(cur.key) * ps
                if cur.swa_lock == 0 and cur.swa is not None:
                    swa += n
                covered += n
                cur = cur.parent
        return full, swa

    def unlock(self, receipt: TreeLock) -> None:
        """Release a ``lock`` receipt (once).

        Raises:
            MemoryModelError: on a second release or a lock count going negative.
        Mutates: lock counts, protected→evictable ledgers, leaf sets.
        """
        if receipt.released:
            raise MemoryModelError("tree lock released twice")
        receipt.released = True
        root, ps = self.root, self.ps
        cur = receipt.node
        while cur is not root:
            if cur.full_lock <= 0:
                raise MemoryModelError(f"FULL lock underflow on {cur}")
            cur.full_lock -= 1
            if cur.full_lock == 0:
                if cur.full is not None:
                    n = len(cur.key) * ps
                    self.full_evictable += n
                    self.full_protected -= n
                self._update_leaf_sets(cur)
            cur = cur.parent
        if self.swa_tree:
            self._unlock_swa(receipt)

    def _unlock_swa(self, receipt: TreeLock) -> None:
        """``unlock``'s SWA half: release the receipt's SWA segment, up to its boundary uuid."""
        root, ps = self.root, self.ps
        cur, uuid = receipt.node, receipt.swa_uuid
        while cur is not root:
            if cur.swa_lock <= 0:
                raise MemoryModelError(f"SWA lock underflow on {cur}")
            cur.swa_lock -= 1
            if cur.swa_lock == 0:
                if cur.swa is not None:
                    n = len(cur.key) * ps
                    self.swa_evictable += n
                    self.swa_protected -= n
                self._update_leaf_sets(cur)
            if uuid is not None and cur.swa_uuid == uuid:
                break
            cur = cur.parent
