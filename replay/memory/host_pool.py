"""HiCache host (L2) pool: a CPU free list of host slots (DESIGN.md §4.2).

``host_free`` selects the free path compared by sgl-project/sglang#30658:

* ``eager_cat`` — every free concatenates the freed slots onto the whole free list (one
  O(pool) ``torch.cat`` per free: the pre-fix behaviour);
* ``lazy_merge`` — a free appends the chunk to a release list in O(1); the chunks are merged
  into the free list with one concatenation (no sort) only when an allocation needs more than
  the free list holds. Released slots count as available but are never handed out before the
  merge.

Both paths run under one re-entrant lock; double alloc and double free raise.
Slots start at 0 (the host pool has no padding slot); allocations are page multiples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import torch

from replay.memory.allocator import pages_to_tokens
from replay.memory.results import IntegrityError, MemoryModelError
from tracer.schema import Pool, PoolOp

_HOST_CODES = {"host_full": int(Pool.HOST_FULL), "host_swa": int(Pool.HOST_SWA)}
_ALLOC, _FREE = int(PoolOp.ALLOC), int(PoolOp.FREE)

_I64 = torch.int64


class HostPool:
    """One host pool.

    Args:
        capacity_tokens: slots (rounded down to whole pages).
        page_size: tokens per page.
        host_free: ``eager_cat`` | ``lazy_merge``.
        name: pool name (``host_full`` / ``host_swa``).
    """

    def __init__(self, capacity_tokens: int, page_size: int, host_free: str, name: str = "host_full"):
        if host_free not in ("eager_cat", "lazy_merge"):
            raise ValueError(f"unknown host_free {host_free!r}")
        self.name = name
        self.pool_code = _HOST_CODES.get(name, int(Pool.HOST_FULL))
        self.emit = None  # ``emit(pool, op, rid, num_slots, num_pages, dur_ns)``, e.g. ``tracer.pool``
        self.page_size = page_size
        self.capacity_tokens = capacity_tokens // page_size * page_size
        self.host_free = host_free
        self.lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        """Empty the pool. Mutates: every field."""
        with self.lock:
            self.free_slots = torch.arange(self.capacity_tokens, dtype=_I64)
            self.release_slots: list[torch.Tensor] = []
            self.num_release_slots = 0
            self.slot_used = torch.zeros(self.capacity_tokens, dtype=torch.bool)
            self.num_merges = 0
            self.num_cat_elems = 0

    def available_tokens(self) -> int:
        """Free plus released (not yet merged) slots."""
        return len(self.free_slots) + self.num_release_slots

    def used_tokens(self) -> int:
        """Slots held by the tree."""
        return self.capacity_tokens - self.available_tokens()

    def _merge_release_slots(self) -> None:
        if self.num_release_slots == 0:
            return
        if len(self.free_slots) == 0 and len(self.release_slots) == 1:
            self.free_slots = self.release_slots[0]
        else:
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])
            self.num_cat_elems += len(self.free_slots)
        self.release_slots = []
        self.num_release_slots = 0
        self.num_merges += 1

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """``_alloc`` emitting a ``pool`` alloc row with its measured CPU (``dur_ns``)."""
        if self.emit is None:
            return self._alloc(num_tokens)
        t0 = time.perf_counter_ns()
        out = self._alloc(num_tokens)
        if out is not None and num_tokens:
            ps = self.page_size
            self.emit(self.pool_code, _ALLOC, -1, num_tokens, num_tokens // ps, time.perf_counter_ns() - t0)
        return out

    def free(self, slots: torch.Tensor) -> int:
        """``_free`` emitting a ``pool`` free row with its measured CPU (``dur_ns``)."""
        if self.emit is None:
            return self._free(slots)
        t0 = time.perf_counter_ns()
        n = self._free(slots)
        if n:
            self.emit(self.pool_code, _FREE, -1, n, n // self.page_size, time.perf_counter_ns() - t0)
        return n

    def _alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Take ``num_tokens`` slots from the head (merging released chunks if short).

        Args:
            num_tokens: a multiple of page_size.
        Returns:
            cloned slot indices, or None when fewer are available.
        Raises:
            MemoryModelError: unaligned size or a slot handed out twice.
        Mutates: free list, release list, ``slot_used``.
        """
        if num_tokens % self.page_size:
            raise MemoryModelError(f"{self.name}: alloc({num_tokens}) is not a page multiple")
        with self.lock:
            if num_tokens > self.available_tokens():
                return None
            if num_tokens > len(self.free_slots):
                self._merge_release_slots()
            out = self.free_slots[:num_tokens].clone()
            self.free_slots = self.free_slots[num_tokens:]
            if bool(self.slot_used[out].any()):
                raise MemoryModelError(f"{self.name}: double alloc of host slots")
            self.slot_used[out] = True
            return out

    def _free(self, slots: torch.Tensor) -> int:
        """Return slots to the pool.

        Args:
            slots: slot indices currently allocated.
        Returns:
            number of slots freed.
        Raises:
            MemoryModelError: when a slot is not allocated (double free).
        Mutates: free list (eager) or release list (lazy), ``slot_used``.
        """
        if slots.numel() == 0:
            return 0
        with self.lock:
            if not bool(self.slot_used[slots].all()):
                raise MemoryModelError(f"{self.name}: double free of host slots")
            self.slot_used[slots] = False
            if self.host_free == "eager_cat":
                self.free_slots = torch.cat([self.free_slots, slots])
                self.num_cat_elems += len(self.free_slots)
            else:
                self.release_slots.append(slots)
                self.num_release_slots += len(slots)
            return len(slots)

    def alloc_pages(self, num_pages: int) -> list[int] | None:
        """Allocate whole pages and return host page ids (slot // page_size of each page).

        Returns:
            page ids, or None when short.
        Mutates: as ``alloc``.
        """
        slots = self.alloc(num_pages * self.page_size)
        if slots is None:
            return None
        return (slots[:: self.page_size] // self.page_size).tolist()

    def free_pages(self, page_ids: Sequence[int]) -> int:
        """Free whole host pages by id. Returns slots freed. Mutates: as ``free``."""
        if not len(page_ids):
            return 0
        return self.free(pages_to_tokens(torch.tensor(page_ids, dtype=_I64), self.page_size))

    def check_integrity(self) -> None:
        """Free + released slots are unique, unused, and complement ``slot_used``.

        Raises:
            IntegrityError: on any violation.
        """
        with self.lock:
            free = torch.cat([self.free_slots, *self.release_slots])
            if self.num_release_slots != sum(len(t) for t in self.release_slots):
                raise IntegrityError(f"{self.name}: release count drifted")
            if len(torch.unique(free)) != len(free):
                raise IntegrityError(f"{self.name}: duplicate slot in the free lists")
            if len(free) and bool(self.slot_used[free].any()):
                raise IntegrityError(f"{self.name}: a free slot is marked used")
            if int(self.slot_used.sum()) + len(free) != self.capacity_tokens:
                raise IntegrityError(f"{self.name}: used + free != capacity (lost slot)")
