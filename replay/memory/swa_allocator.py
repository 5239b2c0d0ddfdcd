"""Device pool pairs the tree and the requests allocate from.

``SWAKVPools`` models SGLang's ``SWATokenToKVPoolAllocator`` (DESIGN.md §4.1): a full and an
SWA sub-allocator paged in lockstep plus a full→SWA mapping (0 = no SWA peer). Because the two
sides page in lockstep, the mapping is kept per *page* (``mapping[full_page] = swa_page``),
SGLang's per-slot mapping restricted to page representatives. It is a Python list of ints:
every access touches O(pages) entries, where a torch op on a tiny index tensor would cost
1-4 µs of dispatch. An SWA free reads and clears the mapping and must precede the full free of
the same pages.

A large extend's mapping is written lazily (a *pending run*: its full and SWA page lists, whose
mapping entries still read 0). Most of such a run's SWA goes again at the request's next
out-of-window release, which takes the run's leading pages by slicing it (``free_swa_chunks``)
instead of writing and then reading back and clearing each entry (chunked prefill: ~500 pages per
chunk); every other reader of the mapping writes the pending runs first (``_write_pending``), so
what any reader sees, and the SWA free list's order, are as if each run had been mapped at once.

``PlainKVPools`` is the same interface over one full pool (models without SWA).
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.memory.allocator import DeviceAllocator, num_new_pages
from replay.memory.results import IntegrityError, MemoryModelError

#: a request's extend run of this many pages or more is mapped lazily (``SWAKVPools``)
PENDING_RUN_PAGES = 32


class PlainKVPools:
    """One full device pool; the SWA calls are no-ops.

    Args:
        full: the full-attention allocator.
    """

    has_swa = False

    def __init__(self, full: DeviceAllocator):
        self.full = full
        self.swa = None
        self.page_size = full.page_size

    def full_available_tokens(self) -> int:
        """Free full slots."""
        return self.full.available_tokens()

    def swa_available_tokens(self) -> int:
        """No SWA pool: reports the full side."""
        return self.full.available_tokens()

    def available_tokens(self) -> int:
        """Free slots."""
        return self.full.available_tokens()

    def alloc_extend_pages(self, prefix_lens, seq_lens) -> list[list[int]] | None:
        """See ``DeviceAllocator.alloc_extend_pages``."""
        return self.full.alloc_extend_pages(prefix_lens, seq_lens)

    def alloc_decode_pages(self, seq_lens) -> list[int | None] | None:
        """See ``DeviceAllocator.alloc_decode_pages``."""
        return self.full.alloc_decode_pages(seq_lens)

    def free_full_chunks(self, chunks: Sequence[Sequence[int]]) -> None:
        """Free full page lists (in order) with one release. Mutates: the full free list."""
        self.full.free_page_chunks(chunks)

    def free_swa_chunks(self, chunks: Sequence[Sequence[int]]) -> int:
        """No SWA pool: nothing to free."""
        return 0

    def free_pages_both(self, full_pages: Sequence[int]) -> None:
        """Free full pages (and their SWA peers when there is an SWA side)."""
        self.free_swa_chunks([full_pages])
        self.free_full_chunks([full_pages])

    def free_full_only(self, full_pages: Sequence[int]) -> None:
        """Free full pages whose SWA peers are already gone."""
        self.free_full_chunks([full_pages])

    def free_swa_of(self, full_pages: Sequence[int]) -> int:
        """Free the SWA peers of full pages; returns SWA pages freed."""
        return self.free_swa_chunks([full_pages])

    def translate(self, full_pages: Sequence[int]) -> list[int]:
        """No SWA pool: no peers."""
        return [0] * len(full_pages)

    def free_group_begin(self) -> None:
        """Defer frees until ``free_group_end``."""
        self.full.free_group_begin()

    def free_group_end(self) -> None:
        """Release deferred frees."""
        self.full.free_group_end()

    def check_integrity(self) -> None:
        """Check the allocator's free list."""
        self.full.check_integrity()


class SWAKVPools(PlainKVPools):
    """Full + SWA sub-allocators in lockstep with a page-level full→SWA mapping.

    Args:
        full: full-attention allocator (``size``).
        swa: sliding-window allocator (``size_swa``), same page size.
    """

    has_swa = True
    #: extend runs this long or longer are left pending (:data:`PENDING_RUN_PAGES`)
    pending_run_pages = PENDING_RUN_PAGES

    def __init__(self, full: DeviceAllocator, swa: DeviceAllocator):
        if full.page_size != swa.page_size:
            raise ValueError("full and SWA pools must share a page size")
        super().__init__(full)
        self.swa = swa
        self._mapping: list[int] = [0] * (full.num_pages + 1)
        self._pending: list[tuple[list[int], list[int]]] = []  # (full pages, their SWA pages), unmapped
        self.num_unmapped_swa_frees = 0

    @property
    def mapping(self) -> list[int]:
        """The page-level full→SWA mapping (0 = no SWA peer), every pending run written."""
        if self._pending:
            self._write_pending()
        return self._mapping

    def _write_pending(self) -> None:
        """Write the pending runs' mapping entries."""
        runs, self._pending = self._pending, []
        for f, s in runs:
            self._map(f, s)

    # ---- sizes -------------------------------------------------------------------------

    def swa_available_tokens(self) -> int:
        """Free SWA slots."""
        return self.swa.available_tokens()

    def available_tokens(self) -> int:
        """min(full, SWA), as SGLang's ``available_size``."""
        return min(self.full.available_tokens(), self.swa.available_tokens())

    def _pages_available(self, n: int) -> bool:
        return n <= self.full.available_pages() and n <= self.swa.available_pages()

    # ---- allocation --------------------------------------------------------------------

    def _map(self, full_pages: Sequence[int], swa_pages: Sequence[int]) -> None:
        # (a plain loop: CPython 3.11 specializes ``list[int] = x`` to one instruction, which
        # makes it twice as fast as ``map(mapping.__setitem__, ...)``)
        mapping = self._mapping
        for f, s in zip(full_pages, swa_pages):
            mapping[f] = s

    def alloc_extend_pages(self, prefix_lens, seq_lens) -> list[list[int]] | None:
        """Lockstep extend: one ``num_new_pages`` on both sides, then ``mapping[full] = swa``.

        A request's run of :data:`PENDING_RUN_PAGES` pages or more is left pending (mapped when
        a reader needs it, see the module docstring).

        Returns:
            full page ids per request, or None when either side is short (nothing taken).
        Mutates: both free lists, the mapping (or the pending runs).
        """
        ps = self.page_size
        total = sum(num_new_pages(p, s, ps) for p, s in zip(prefix_lens, seq_lens))
        if not self._pages_available(total):
            return None
        full = self.full.alloc_extend_pages(prefix_lens, seq_lens)
        swa = self.swa.alloc_extend_pages(prefix_lens, seq_lens)
        if full is None or swa is None:  # cannot happen after the check above
            raise MemoryModelError("lockstep extend failed after the availability check")
        pending = self._pending
        for f, s in zip(full, swa):
            if len(f) >= self.pending_run_pages:
                pending.append((f, s))
            else:
                self._map(f, s)
        return full

    def alloc_decode_pages(self, seq_lens) -> list[int | None] | None:
        """Lockstep decode. Both sides are checked before either allocates.

        Returns:
            per request the new full page or None; None overall when short.
        Mutates: both free lists, the mapping.
        """
        ps = self.page_size
        flags = [(s - 1) % ps == 0 for s in seq_lens]
        need = sum(flags)
        if not self._pages_available(need):
            return None
        full = self.full.alloc_flagged_pages(flags, need)
        swa = self.swa.alloc_flagged_pages(flags, need)
        if need:
            mapping = self._mapping  # fresh pages: no pending run holds them
            for f, s in zip(full, swa):
                if f is not None:
                    mapping[f] = s
        return full

    def alloc_swa_for(self, full_pages: Sequence[int]) -> list[int] | None:
        """Give SWA peers to full pages that have none (load-back / EIC restore).

        Returns:
            the new SWA pages, or None when the SWA pool is short.
        Raises:
            MemoryModelError: when a page already has a peer.
        Mutates: SWA free list, the mapping.
        """
        if not full_pages:
            return []
        if any(self.mapping[f] for f in full_pages):
            raise MemoryModelError("alloc_swa_for: a full page already has an SWA peer")
        swa = self.swa.alloc_page_list(len(full_pages))
        if swa is None:
            return None
        self._map(full_pages, swa)
        return swa

    # ---- mapping -----------------------------------------------------------------------

    def translate(self, full_pages: Sequence[int]) -> list[int]:
        """SWA peers of full pages (0 = none)."""
        mapping = self.mapping
        return [mapping[f] for f in full_pages]

    def move_swa(self, from_full: Sequence[int], to_full: Sequence[int]) -> list[int]:
        """Re-point the SWA peers of ``from_full`` onto ``to_full`` (locked-full recovery).

        Returns:
            the moved SWA pages.
        Mutates: the mapping.
        """
        mapping = self.mapping
        if any(mapping[t] for t in to_full):
            raise MemoryModelError("move_swa: destination pages already have SWA peers")
        swa = [mapping[f] for f in from_full]
        for f in from_full:
            mapping[f] = 0
        self._map(to_full, swa)
        return swa

    # ---- free --------------------------------------------------------------------------

    def free_swa_chunks(self, chunks: Sequence[Sequence[int]]) -> int:
        """Free the SWA peers of full page lists: read and clear the mapping, free entries > 0.

        SGLang would free page 0 for an unmapped entry (sgl-project/sglang#38519); the model
        skips it and counts it in ``num_unmapped_swa_frees``. One release for all chunks. A chunk
        holding a pending run's leading pages takes their SWA pages from the run (a slice); an
        entry that reads 0 while runs are pending is read again after they are written.

        Returns:
            SWA pages freed.
        Mutates: the mapping (or the pending runs), the SWA free list (or its open group).
        """
        out, freed = [], 0
        for chunk in chunks:
            live = self._pending_prefix(chunk) if self._pending and len(chunk) >= self.pending_run_pages else None
            if live is None:
                live = []
                self._read_clear(chunk, live)
            out.append(live)
            freed += len(live)
        self.swa.free_page_chunks(out)
        return freed

    def _read_clear(self, chunk: Sequence[int], live: list[int]) -> None:
        """Append the SWA peers of ``chunk`` to ``live`` and clear their entries."""
        mapping = self._mapping
        for f in chunk:
            s = mapping[f]
            if s:
                live.append(s)
                mapping[f] = 0
            else:
                if self._pending:  # a pending run's page: written now, read again
                    self._write_pending()
                    s = mapping[f]
                    if s:
                        live.append(s)
                        mapping[f] = 0
                        continue
                self.num_unmapped_swa_frees += 1

    def _pending_prefix(self, chunk: Sequence[int]) -> list[int] | None:
        """The SWA peers of ``chunk`` (as ``_read_clear`` reads them) when it holds a pending
        run's leading pages, those taken from the run by slicing (the run keeps the rest); None
        (nothing changed) when it holds none."""
        for r, (f, s) in enumerate(self._pending):
            head = f[0]
            if head not in chunk:
                continue
            j = chunk.index(head)
            k = min(len(f), len(chunk) - j)
            if chunk[j:j + k] != f[:k]:
                continue
            if k < len(f):
                self._pending[r] = (f[k:], s[k:])
            else:
                del self._pending[r]
            live: list[int] = []
            self._read_clear(chunk[:j], live)
            live += s[:k]
            self._read_clear(chunk[j + k:], live)
            return live
        return None

    def free_full_chunks(self, chunks: Sequence[Sequence[int]]) -> None:
        """Free full pages whose SWA peers are already gone.

        Raises:
            MemoryModelError: when a page still has an SWA peer (it would be stranded).
        Mutates: the full free list.
        """
        mapping = self.mapping if any(chunks) else self._mapping
        for chunk in chunks:
            for f in chunk:
                if mapping[f]:
                    raise MemoryModelError("full free of a page that still has an SWA peer "
                                           "(free SWA first)")
        self.full.free_page_chunks(chunks)

    def free_group_begin(self) -> None:
        """Defer frees on both sides; SWA peers are resolved (mapping cleared) at enqueue."""
        self.full.free_group_begin()
        self.swa.free_group_begin()

    def free_group_end(self) -> None:
        """Release the SWA side, then the full side."""
        self.swa.free_group_end()
        self.full.free_group_end()

    def check_integrity(self) -> None:
        """Both free lists valid; no free full page keeps a peer; no SWA page mapped twice.

        Raises:
            IntegrityError: on any violation.
        """
        import torch  # only the checks use torch

        self.full.check_integrity()
        self.swa.check_integrity()
        mapping = torch.tensor(self.mapping, dtype=torch.int64)
        if int(mapping[0]) != 0:
            raise IntegrityError("mapping of the reserved page 0 is set")
        free_full = self.full.all_free_page_ids()
        if len(free_full) and bool((mapping[free_full] != 0).any()):
            raise IntegrityError("a free full page still maps to an SWA page")
        mapped = mapping[mapping > 0]
        if len(torch.unique(mapped)) != len(mapped):
            raise IntegrityError("an SWA page is the peer of two full pages")
        if len(mapped) and (int(mapped.max()) > self.swa.num_pages):
            raise IntegrityError("a mapping entry is outside the SWA pool")
        if len(mapped) and bool(torch.isin(mapped, self.swa.all_free_page_ids()).any()):
            raise IntegrityError("a mapped SWA page is also on the SWA free list")
