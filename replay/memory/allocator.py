"""Device KV allocators: a paged free list of page ids (page_size 1 = token allocator).

Semantics follow SGLang 0.5.23's ``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``
(see DESIGN.md §4.1), re-implemented:

* page ids run 1..num_pages; page 0 (slot 0..ps-1) is the reserved padding sink;
* allocation takes the head of the free list; results are copies, never views of the list;
* ``device_free`` decides where freed pages go: ``prepend`` (paged allocator, reuse-first),
  ``append`` (token allocator) or ``sorted_merge`` (staged, then ``sort(cat(free, *staged))``
  only when an allocation runs short — the documented O(pool) cost);
* free groups defer every free until ``free_group_end`` (occupancy lags inside a step).

The free list is a Python list of ints kept *tail first* (its head is the list's end), so taking
``n`` pages and prepending freed ones cost O(n), not O(pool), and no call goes through torch (a
torch op on a tiny index tensor costs microseconds of dispatch, and importing torch seconds).
The tensor-valued API (``alloc``, ``alloc_pages``, ``alloc_extend``, ``alloc_decode``, ``free``
of token slots, ``free_pages``, the census helpers) imports torch on first use; the page-list API
(``alloc_extend_pages``, ``alloc_decode_pages``, ``alloc_page_list``, ``free_page_chunks``) that
the model drives does not. ``num_cat_elems`` counts what the concatenating implementation would
have copied (the free list's length after each release, the merged length of each merge).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from replay.memory.results import IntegrityError, MemoryModelError
from tracer.schema import Pool, PoolOp

_POOL_CODES = {"full": int(Pool.FULL), "swa": int(Pool.SWA)}
_ALLOC, _FREE = int(PoolOp.ALLOC), int(PoolOp.FREE)


def _torch():
    import torch  # imported on first use: the page-list path never needs it

    return torch


def ids_tensor(ids: Sequence[int]):
    """int64 tensor from Python ints (via ``array``: ~2.5x cheaper than ``torch.tensor``)."""
    from array import array

    torch = _torch()
    if not len(ids):
        return torch.empty((0,), dtype=torch.int64)
    return torch.frombuffer(array("q", ids), dtype=torch.int64)


def _id_list(ids) -> list[int]:
    """Python ints from a tensor, an array or a sequence."""
    return ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]


def pages_to_tokens(pages, page_size: int):
    """Expand page ids to the token slot indices they cover, page by page.

    Args:
        pages: int64 page ids (tensor).
        page_size: tokens per page.
    Returns:
        int64 tensor of ``len(pages) * page_size`` slots.
    """
    torch = _torch()
    if page_size == 1:
        return pages.clone()
    offsets = torch.arange(page_size, dtype=torch.int64)
    return (pages[:, None] * page_size + offsets).reshape(-1)


def num_new_pages(prefix_len: int, seq_len: int, page_size: int) -> int:
    """Pages a request needs to grow its KV from ``prefix_len`` to ``seq_len`` tokens."""
    return -(-seq_len // page_size) - (-(-prefix_len // page_size))


class DeviceAllocator:
    """One device pool: a paged free list of page ids.

    Args:
        capacity_tokens: pool size in tokens (rounded down to whole pages).
        page_size: tokens per page; 1 gives the token allocator.
        device_free: ``prepend`` | ``append`` | ``sorted_merge``.
        name: pool name for messages (``full`` / ``swa``).
    """

    def __init__(self, capacity_tokens: int, page_size: int, device_free: str, name: str = "full"):
        if device_free not in ("prepend", "append", "sorted_merge"):
            raise ValueError(f"unknown device_free {device_free!r}")
        self.name = name
        self.page_size = page_size
        self.num_pages = capacity_tokens // page_size
        self.capacity_tokens = self.num_pages * page_size
        self.device_free = device_free
        self.pool_code = _POOL_CODES.get(name, int(Pool.FULL))
        # ``emit(pool, op, rid, num_slots, num_pages)`` per occupancy change (``tracer.pool`` when
        # a backend records; this package never imports the tracer runtime).
        self.emit = None
        self.clear()

    # ---- state -------------------------------------------------------------------------

    def clear(self) -> None:
        """Reset to an empty pool. Mutates: every field."""
        self._rev: list[int] = list(range(self.num_pages, 0, -1))  # the free list, tail first
        self._staged: list[list[int]] = []
        self.num_staged_pages = 0
        self._group_pages: list[list[int]] | None = None
        self._group_tokens: list[list[int]] | None = None
        self.num_merges = 0
        self.num_cat_elems = 0

    @property
    def free_pages(self):
        """The free list, head first, as an int64 tensor (a copy)."""
        return ids_tensor(self._rev[::-1])

    @property
    def staged_pages(self) -> list:
        """Freed pages waiting for a merge (``sorted_merge``), one tensor per free."""
        return [ids_tensor(c) for c in self._staged]

    @property
    def need_sort(self) -> bool:
        """SGLang's ``need_sort``: frees are staged and merged lazily."""
        return self.device_free == "sorted_merge"

    @property
    def in_free_group(self) -> bool:
        """Whether frees are currently deferred."""
        return self._group_pages is not None

    def available_pages(self) -> int:
        """Free pages, staged ones included (they count as available)."""
        return len(self._rev) + self.num_staged_pages

    def available_tokens(self) -> int:
        """Free slots, staged ones included."""
        return (len(self._rev) + self.num_staged_pages) * self.page_size

    def free_list_pages(self) -> int:
        """Pages on the free list itself (staged ones excluded): what ``take_free_pages`` can take
        without a merge."""
        return len(self._rev)

    def used_tokens(self) -> int:
        """Slots not available (in the tree, in requests or pending in a free group)."""
        return self.capacity_tokens - self.available_tokens()

    def _pending_ids(self) -> list[int]:
        if self._group_pages is None:
            return []
        out = [p for c in self._group_pages for p in c]
        if self._group_tokens:
            out.extend(self._token_pages([t for c in self._group_tokens for t in c]))
        return out

    def pending_group_page_ids(self):
        """Page ids freed inside the open free group, not yet released (int64 tensor)."""
        return ids_tensor(self._pending_ids())

    def pending_group_pages(self) -> int:
        """Number of pages freed inside the open free group, not yet released."""
        return len(self._pending_ids())

    def all_free_page_ids(self):
        """Every available page id (free list then staged), for censuses (int64 tensor)."""
        return ids_tensor(self._rev[::-1] + [p for c in self._staged for p in c])

    def merge_and_sort_free(self) -> None:
        """Merge staged pages into the free list and sort it (O(pool)). Mutates: free list."""
        if not self._staged:
            return
        merged = self._rev + [p for c in self._staged for p in c]
        self.num_cat_elems += len(merged)
        merged.sort(reverse=True)  # ascending head first
        self._rev = merged
        self._staged = []
        self.num_staged_pages = 0
        self.num_merges += 1

    # ---- allocation --------------------------------------------------------------------

    # Every occupancy change goes through ``_take_list``/``_release`` and, when ``emit`` is set, is
    # emitted as a ``pool`` row (alloc/free, slots and pages; rid -1: the model's allocator does not know the
    # request), so per pool sum(alloc) - sum(free) is the used size as for the real allocators.
    # Frees deferred by a free group are emitted when the group releases them.

    def _take_list(self, n: int) -> list[int]:
        if n == 0:
            return []
        rev = self._rev
        out = rev[-n:]
        del rev[-n:]
        out.reverse()
        if self.emit is not None:
            self.emit(self.pool_code, _ALLOC, -1, n * self.page_size, n)
        return out

    #: ``_take_list`` for callers that checked ``free_list_pages() >= n`` (the decode coalescer:
    #: the free list's head pages, in order, emitted as one ``pool`` alloc row; no merge)
    take_free_pages = _take_list

    def alloc_page_list(self, num_pages: int) -> list[int] | None:
        """Take ``num_pages`` pages from the head (None when short, nothing taken).
        Mutates: free list (and merges staged pages when short)."""
        if num_pages > len(self._rev):
            self.merge_and_sort_free()
        if num_pages > len(self._rev):
            return None
        return self._take_list(num_pages)

    def alloc_pages(self, num_pages: int):
        """Take ``num_pages`` pages from the head.

        Args:
            num_pages: pages wanted.
        Returns:
            int64 page ids (tensor), or None when the pool is short (nothing taken).
        Mutates: free list (and merges staged pages when short).
        """
        pages = self.alloc_page_list(num_pages)
        return None if pages is None else ids_tensor(pages)

    def alloc(self, num_tokens: int):
        """Page-aligned allocation returning token slots (SGLang ``alloc``).

        Args:
            num_tokens: a multiple of page_size.
        Returns:
            token slot indices (tensor), or None when short.
        Mutates: free list.
        """
        if num_tokens % self.page_size:
            raise MemoryModelError(f"{self.name}: alloc({num_tokens}) is not page-aligned")
        pages = self.alloc_pages(num_tokens // self.page_size)
        return None if pages is None else pages_to_tokens(pages, self.page_size)

    def alloc_extend_pages(
        self, prefix_lens: Sequence[int], seq_lens: Sequence[int]
    ) -> list[list[int]] | None:
        """New pages for a batch of extends, in batch order (the paged ``alloc_extend``).

        The partial last page of each prefix is filled first (it needs no new page); new pages
        are consumed from the head in request order. A staged merge runs when the bound
        ``extend_tokens // ps + bs + 1`` exceeds the free list, as in SGLang.

        Args:
            prefix_lens: tokens each request already holds.
            seq_lens: tokens each request holds after the extend.
        Returns:
            one list of new page ids per request, or None when short (nothing taken).
        Mutates: free list.
        """
        ps = self.page_size
        counts = [num_new_pages(p, s, ps) for p, s in zip(prefix_lens, seq_lens)]
        extend_tokens = sum(s - p for p, s in zip(prefix_lens, seq_lens))
        if extend_tokens // ps + len(counts) + 1 > len(self._rev):
            self.merge_and_sort_free()
        total = sum(counts)
        if total > len(self._rev):
            return None
        flat = self._take_list(total)
        out, pos = [], 0
        for c in counts:
            out.append(flat[pos : pos + c])
            pos += c
        return out

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]):
        """Token slots for a batch of extends (SGLang ``alloc_extend`` output layout).

        Args:
            prefix_lens / seq_lens: per-request lengths before / after.
            last_locs: slot of each request's last prefix token (-1 if none).
        Returns:
            int64 slots for all extended tokens, batch-major (tensor), or None when short.
        Mutates: free list.
        """
        pages = self.alloc_extend_pages(prefix_lens, seq_lens)
        if pages is None:
            return None
        ps = self.page_size
        slots: list[int] = []
        for p, s, last, new in zip(prefix_lens, seq_lens, last_locs, pages):
            ceil_p = -(-p // ps) * ps
            in_place = max(0, min(s, ceil_p) - p)
            slots.extend(range(last + 1, last + 1 + in_place))
            rest = s - p - in_place
            slots.extend([pg * ps + o for pg in new for o in range(ps)][:rest])
        return ids_tensor(slots)

    def alloc_decode_pages(self, seq_lens: Sequence[int]) -> list[int | None] | None:
        """One decode token per request; a request takes a page when ``(seq-1) % ps == 0``.

        Args:
            seq_lens: per-request lengths after adding the decode token.
        Returns:
            per request the new page id, or None where the last page still has room; None
            overall when the pool is short.
        Mutates: free list.
        """
        ps = self.page_size
        need = [(s - 1) % ps == 0 for s in seq_lens]
        return self.alloc_flagged_pages(need, sum(need))

    def alloc_flagged_pages(self, need: Sequence[bool], total: int) -> list[int | None] | None:
        """``alloc_decode_pages`` with its per-request page flags (and their count) given."""
        if len(need) > len(self._rev):
            self.merge_and_sort_free()
        if total > len(self._rev):
            return None
        if total == 0:
            return [None] * len(need)
        flat = iter(self._take_list(total))
        return [next(flat) if n else None for n in need]

    def alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int]):
        """Decode slots (SGLang ``alloc_decode``): a new page's first slot or ``last_loc + 1``."""
        pages = self.alloc_decode_pages(_id_list(seq_lens))
        if pages is None:
            return None
        ps = self.page_size
        return ids_tensor([last + 1 if pg is None else pg * ps for pg, last in zip(pages, _id_list(last_locs))])

    # ---- free --------------------------------------------------------------------------

    def _release(self, page_ids: list[int]) -> None:
        n = len(page_ids)
        if n and self.emit is not None:
            self.emit(self.pool_code, _FREE, -1, n * self.page_size, n)
        if self.device_free == "sorted_merge":
            self._staged.append(page_ids)
            self.num_staged_pages += n
            return
        if self.device_free == "prepend":
            self._rev.extend(reversed(page_ids))  # page_ids[0] becomes the head
        else:
            self._rev[0:0] = page_ids[::-1]
        self.num_cat_elems += len(self._rev)

    def free_page_ids(self, page_ids) -> None:
        """Free exactly these pages (no dedup), in order. Mutates: free list or the open group."""
        ids = _id_list(page_ids)
        if not ids:
            return
        if self._group_pages is not None:
            self._group_pages.append(ids)
            return
        self._release(ids)

    def free_page_chunks(self, chunks: Sequence[Sequence[int]]) -> None:
        """Free several page lists with one release.

        The free list ends up exactly as after one ``free_page_ids`` call per chunk in order
        (with ``prepend`` the later chunk lands in front).
        Mutates: free list or the open group.
        """
        chunks = [c for c in chunks if len(c)]
        if not chunks:
            return
        if self._group_pages is None and self.device_free == "prepend":
            # ``_release`` of the chunks joined (the later in front), without joining them: the
            # same emit and the same free list
            n = sum(map(len, chunks))
            if self.emit is not None:
                self.emit(self.pool_code, _FREE, -1, n * self.page_size, n)
            rev = self._rev
            for c in chunks:
                rev.extend(reversed(c))
            self.num_cat_elems += len(rev)
            return
        if len(chunks) == 1:
            flat = chunks[0]
            if self._group_pages is not None or self.device_free == "sorted_merge":
                flat = list(flat)  # kept (staged or grouped): its own list
        elif self._group_pages is not None or self.device_free != "prepend":
            flat = list(chain.from_iterable(chunks))
        else:
            flat = list(chain.from_iterable(reversed(chunks)))
        if self._group_pages is not None:
            self._group_pages.append(flat)
        else:
            self._release(flat)

    def _token_pages(self, tokens: list[int]) -> list[int]:
        if self.page_size == 1:
            return list(tokens)
        ps = self.page_size
        return sorted({t // ps for t in tokens})

    def free(self, token_indices) -> None:
        """Free token slots: the paged allocator releases ``unique(idx // ps)`` (sorted).

        Mutates: free list or the open group.
        """
        tokens = _id_list(token_indices)
        if not tokens:
            return
        if self._group_tokens is not None:
            self._group_tokens.append(tokens)
            return
        self._release(self._token_pages(tokens))

    def free_group_begin(self) -> None:
        """Start deferring frees (not nestable). Mutates: group state."""
        if self._group_pages is not None:
            raise MemoryModelError(f"{self.name}: free groups cannot be nested")
        self._group_pages = []
        self._group_tokens = []

    def free_group_end(self) -> None:
        """Release everything freed since ``free_group_begin`` in one call per kind."""
        if self._group_pages is None:
            raise MemoryModelError(f"{self.name}: free_group_end without begin")
        tokens, pages = self._group_tokens, self._group_pages
        self._group_pages = self._group_tokens = None
        if tokens:
            self._release(self._token_pages([t for c in tokens for t in c]))
        if pages:
            self._release(pages[0] if len(pages) == 1 else [p for c in pages for p in c])

    # ---- checks ------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Free ids are unique, in 1..num_pages, and never more than the pool.

        Raises:
            IntegrityError: on a duplicate, an out-of-range id or the reserved page.
        """
        ids = self._rev + [p for c in self._staged for p in c]
        if len(ids) > self.num_pages:
            raise IntegrityError(f"{self.name}: {len(ids)} free pages > {self.num_pages}")
        if ids:
            if min(ids) < 1 or max(ids) > self.num_pages:
                raise IntegrityError(f"{self.name}: free page id out of range (page 0 is reserved)")
            if len(set(ids)) != len(ids):
                raise IntegrityError(f"{self.name}: duplicate page in the free list (double free)")
        if self.num_staged_pages != sum(len(c) for c in self._staged):
            raise IntegrityError(f"{self.name}: staged page count drifted")


class TokenAllocator(DeviceAllocator):
    """Token allocator (page_size 1); SGLang's non-sort token allocator appends on free."""

    def __init__(self, capacity_tokens: int, device_free: str = "append", name: str = "full"):
        super().__init__(capacity_tokens, 1, device_free, name)


class PagedAllocator(DeviceAllocator):
    """Paged allocator; SGLang's non-sort paged allocator prepends on free."""

    def __init__(
        self, capacity_tokens: int, page_size: int, device_free: str = "prepend", name: str = "full"
    ):
        super().__init__(capacity_tokens, page_size, device_free, name)
