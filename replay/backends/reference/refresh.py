"""The waiting-queue prefix refresh's walks, kept from one refresh to the next.

Every 32nd admission attempt with requests waiting walks the whole sequences of the first 128
waiting requests (``AdmissionMixin._touch_waiting_prefixes``), and on ``production_1h`` that is
~1.7 M walks. Between two refreshes the queue mostly loses a few heads (admitted) and gains as
many at position 128, and the tree changes away from most of those walks: each walk's memo
(``GrowingKeys.walks``, voided by any change to a node it read, :mod:`replay.memory.radix.match`)
still holds. :class:`RefreshWindow` keeps the last refresh's requests and their memos, lines
the new first 128 up with them by identity, and walks again only the new requests and those
whose memo a change voided, as pure reads (``_match_walk(split=False)``): its answer is then
exactly the best nodes a walk of every request would give, in the refresh's order (head last).
Where some walk would split a node it answers None, having changed nothing but memos, and the
caller walks every request as before (``RadixTree.touch_many``, whose splits order the touches).

A waiting request's sequence does not change while it waits (it decodes nothing), so its keys
list and memo are those of the last refresh. Only a retraction puts a request that ran (its
sequence longer) back in the queue: the caller counts them (``requeued``), and a window from
before one is not reused.
"""

from __future__ import annotations

from replay.memory.radix.match import GrowingKeys

_VOID = [None, None]  # the memo of a walk that was not memoized: never valid


class RefreshWindow:
    """The requests the last refresh walked (queue order), their keys and their walks' memos."""

    __slots__ = ("reqs", "keys", "memos", "requeued", "kept", "walked")

    def __init__(self) -> None:
        self.requeued = 0  # the caller's count of requests put back in the queue, at the last refresh
        self.reqs: list = []
        self.keys: list = []
        self.memos: list = []
        #: walks answered from a kept memo, and walked (or taken from a fresh memo): diagnostics
        self.kept = self.walked = 0

    def clear(self) -> None:
        self.reqs, self.keys, self.memos = [], [], []

    def _cut(self, head: list, requeued: int) -> int:
        """How many of the last refresh's requests lead ``head`` in the same order (the others
        left the queue's front since); 0 after a request was put back in the queue."""
        reqs = self.reqs
        if not reqs or not head or requeued != self.requeued:
            return 0
        try:
            k = reqs.index(head[0])  # the heads admitted (or dropped) since: reqs[:k]
        except ValueError:
            return 0
        keep = len(reqs) - k
        if keep > len(head) or reqs[k:] != head[:keep]:
            return 0  # not a cut of the front (a request left the middle): walk all again
        return keep

    def bests(self, tree, head: list, requeued: int) -> list | None:
        """The best nodes of the walks of ``head``'s whole sequences (``head``: the first waiting
        requests, in queue order), in walk order (``head`` reversed), when no walk splits a node;
        None otherwise (the window is then cleared; the tree is unchanged). ``requeued``: how many
        requests the caller has put back in the queue so far (retractions)."""
        keep = self._cut(head, requeued)
        k = len(self.reqs) - keep
        if keep:
            keys, memos = self.keys[k:], self.memos[k:]
        else:
            keys, memos = [], []
        kept = keep
        for i in range(keep):
            if memos[i][0] is not tree:
                memo = _walk(tree, keys[i])
                if memo is None:
                    self.clear()
                    return None
                memos[i] = memo
                kept -= 1
        for req in head[keep:]:
            key = req.whole_keys()
            memo = _walk(tree, key)
            if memo is None:
                self.clear()
                return None
            keys.append(key)
            memos.append(memo)
        self.reqs, self.keys, self.memos, self.requeued = head, keys, memos, requeued
        self.kept += kept
        self.walked += len(head) - kept
        tree.walk_memo_hits += kept
        return [m[1][1] for m in reversed(memos)]

    def note(self, tree, head: list, keys: list, requeued: int) -> None:
        """Keep a refresh the caller walked itself (``keys``: ``head``'s whole sequences in walk
        order); a walk that was not memoized is kept as void (walked again next time)."""
        memos = []
        for key in reversed(keys):
            walks = getattr(key, "walks", None)
            memo = walks.get(len(key)) if walks is not None else None
            memos.append(memo if memo is not None and memo[0] is tree else _VOID)
        self.reqs, self.keys, self.memos, self.requeued = head, keys[::-1], memos, requeued

    def check_integrity(self, tree, head: list, requeued: int) -> None:
        """What the next refresh of ``head`` would keep is its requests' own keys, and each live
        memo among them is the one its keys hold for that length (raises ``AssertionError``)."""
        assert len(self.reqs) == len(self.keys) == len(self.memos), "refresh window: lists differ in length"
        keep = self._cut(head, requeued)
        k = len(self.reqs) - keep
        for req, key, memo in zip(self.reqs[k:], self.keys[k:], self.memos[k:]):
            assert req.whole_keys() is key, f"refresh window: request {req.rid}'s keys changed while waiting"
            if memo[0] is tree:
                assert key.walks.get(len(key)) is memo, f"refresh window: request {req.rid}'s memo is not its keys'"


def _walk(tree, key):
    """The memo of ``key``'s whole walk: a live one, else the walk again as a pure read (then
    memoized); None where it would split a node (or cannot be memoized)."""
    if type(key) is not GrowingKeys:
        return None
    n = len(key)
    memo = key.walks.get(n)
    if memo is not None and memo[0] is tree:
        return memo
    if tree._match_walk(key, split=False) is None:
        return None
    memo = key.walks.get(n)
    return memo if memo is not None and memo[0] is tree else None


__all__ = ["RefreshWindow"]
