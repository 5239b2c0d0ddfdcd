"""``KVCacheModel``: the request-level facade the replay engine drives.

It builds the pools and the cache (radix, chunk or EIC) from a ``MemoryConfig`` and speaks the
scheduler's vocabulary: ``match``, ``admit``, ``load_back``, ``alloc_extend``, ``alloc_decode``,
``checkpoint``, ``release``, ``free_swa_out_of_window``, ``evict``, free groups, ``snapshot``
and ``check_integrity``. With ``debug_check_every_op`` every public call ends with a full
integrity check.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from replay.memory.allocator import DeviceAllocator
from replay.memory.chunk_cache import ChunkCache
from replay.memory.config import MemoryConfig
from replay.memory.eic_cache import EICCache
from replay.memory.radix.match import GrowingKeys
from replay.memory.radix_cache import RadixCache
from replay.memory.requests import ReqState, RequestTable
from replay.memory.results import EvictResult, MatchResult, MemoryModelError, PoolSnapshot
from replay.memory.swa_allocator import PlainKVPools, SWAKVPools


_OPS: list[str] = []  # names of the ``_op`` methods


def _op(fn):
    """Run ``check_integrity()`` after the call when the debug flag is on (a model built without
    the flag calls the undecorated method: see ``KVCacheModel.__init__``)."""
    _OPS.append(fn.__name__)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        if self.config.debug_check_every_op:
            self.check_integrity()
        return out

    return wrapper


class KVCacheModel:
    """Pools + cache + running requests.

    Args:
        config: the frozen model config.
    """

    def __init__(self, config: MemoryConfig):
        self.config = cfg = config
        ps = cfg.page_size
        full = DeviceAllocator(cfg.full_pool_tokens, ps, cfg.device_free, "full")
        if cfg.has_swa:
            swa = DeviceAllocator(cfg.swa_pool_tokens, ps, cfg.device_free, "swa")
            self.pools = SWAKVPools(full, swa)
        else:
            self.pools = PlainKVPools(full)
        self.host_full = self.host_swa = None
        if cfg.has_hicache:
            from replay.memory.host_pool import HostPool  # torch: imported only with HiCache

            self.host_full = HostPool(cfg.host_pool_tokens, ps, cfg.host_free, "host_full")
            if cfg.has_swa and cfg.resolved_swa_host_pool_tokens > 0:
                self.host_swa = HostPool(
                    cfg.resolved_swa_host_pool_tokens, ps, cfg.host_free, "host_swa"
                )
        if cfg.cache_kind == "chunk":
            self.cache = ChunkCache(cfg, self.pools)
        elif cfg.cache_kind == "eic":
            self.cache = EICCache(cfg, self.pools)
        else:
            self.cache = RadixCache(cfg, self.pools, self.host_full, self.host_swa)
        self.requests = RequestTable()
        if not cfg.debug_check_every_op:  # no check after each call: skip the wrappers' dispatch
            for name in _OPS:
                raw = getattr(getattr(type(self), name), "__wrapped__", None)  # None: overridden
                if raw is not None:
                    setattr(self, name, raw.__get__(self))

    @property
    def tree(self):
        """The radix tree (None for the chunk cache)."""
        return self.cache.tree

    def _key(self, page_hashes: Sequence[int], max_tokens: int | None) -> list[int]:
        # one copy at most (a list passes through when uncut: the tree never keeps a match key)
        if max_tokens is not None:
            page_hashes = page_hashes[: max(0, max_tokens) // self.config.page_size]
        return page_hashes if isinstance(page_hashes, list) else list(page_hashes)

    def _match_args(self, page_hashes: Sequence[int], max_tokens: int | None) -> tuple:
        """The cache's ``match``/``touch`` arguments for at most ``max_tokens``: the key and a page
        limit where the cache's tree stops at the limit itself (no copy of the key: a
        ``GrowingKeys`` list keeps its memo of verified node keys), else the key cut."""
        if max_tokens is not None and self.cache.match_limit:
            return self._key(page_hashes, None), max(0, max_tokens) // self.config.page_size
        return (self._key(page_hashes, max_tokens),)

    # ---- admission ---------------------------------------------------------------------

    @_op
    def match(self, page_hashes: Sequence[int], max_tokens: int | None = None) -> MatchResult:
        """Prefix match (scheduler ``match_prefix``; refreshes recency, may split nodes).

        Args:
            page_hashes: the request's page hashes.
            max_tokens: match at most this many tokens (e.g. input_len - 1).
        Returns:
            MatchResult in tokens.
        """
        return self.cache.match(*self._match_args(page_hashes, max_tokens))

    def peek(self, page_hashes: Sequence[int], max_tokens: int | None = None) -> MatchResult | None:
        """``match``'s result without its effects, or None where it would change the tree (a split)
        and for a cache other than the plain radix cache (no tree, or EIC's own match)."""
        if type(self.cache) is not RadixCache:
            return None
        limit = None if max_tokens is None else max(0, max_tokens) // self.config.page_size
        return self.tree.peek(self._key(page_hashes, None), limit)

    @_op
    def touch(self, page_hashes: Sequence[int], max_tokens: int | None = None) -> None:
        """``match`` (``max_tokens`` as there) for its effects only (recency, splits, SWA LRU), no
        result: what the scheduler's waiting-queue prefix refresh does with the matches it
        discards (a cache's own ``match`` beside its tree's is a pure read: EIC's SWA count)."""
        touch = getattr(self.cache, "touch", None)
        if touch is None:
            self.cache.match(self._key(page_hashes, max_tokens))
        else:
            touch(*self._match_args(page_hashes, max_tokens))

    @_op
    def touch_many(self, page_hashes_list: Sequence[Sequence[int]]) -> list | None:
        """``touch`` of each sequence in turn (the waiting-queue refresh), in one call; the walks'
        best nodes where the plain radix cache walked them (for ``RadixTree.apply_touches``), else
        None."""
        many = getattr(self.cache, "touch_many", None)
        if many is None:
            for page_hashes in page_hashes_list:
                self.touch(page_hashes)
            return None
        bests = many([self._key(p, None) for p in page_hashes_list])
        return bests if type(self.cache) is RadixCache else None

    @_op
    def admit(
        self,
        rid: Any,
        page_hashes: Sequence[int],
        match: MatchResult | None = None,
        priority: int = 0,
        max_match_tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> MatchResult:
        """Start a request on its matched prefix and lock it.

        Args:
            rid: new request id.
            page_hashes: the request's page hashes (its insert key; extend later via
                ``checkpoint``/``release``).
            match: a match from ``match`` just before; re-matched if stale or None.
            priority: request priority.
            max_match_tokens: cap for the re-match.
            prompt_tokens: prompt length (FULL-only radix trees split the cached leaf there
                and give the prompt part priority + 1, as SGLang does).
        Returns:
            the MatchResult used.
        Mutates: request table, tree locks.
        """
        if match is None or not self.cache.is_fresh(match):
            match = self.cache.match(self._key(page_hashes, max_match_tokens))
        req = ReqState(rid=rid, page_hashes=_held(page_hashes), priority=priority,
                       prompt_tokens=prompt_tokens)
        self.requests.add(req)
        self.cache.admit(req, match)
        return match

    @_op
    def load_back(self, rid: Any) -> int:
        """Load the request's host hit back to device (HiCache) or restore EIC SWA.

        Returns:
            tokens loaded.
        """
        return self.cache.load_back(self.requests.get(rid))

    # ---- allocation --------------------------------------------------------------------

    @_op
    def alloc_extend(self, rid: Any, num_tokens: int) -> bool:
        """Grow one request by ``num_tokens`` (see ``alloc_extend_batch``)."""
        return self.alloc_extend_batch([(rid, num_tokens)])

    @_op
    def alloc_extend_batch(self, items: Iterable[tuple[Any, int]]) -> bool:
        """Allocate an extend batch atomically (partial last pages filled first).

        Args:
            items: (rid, extend tokens) in batch order.
        Returns:
            False (nothing allocated) when a pool is short; the caller evicts and retries.
        Mutates: pools, request rows.
        """
        reqs, lens = [], []
        for rid, n in items:
            reqs.append(self.requests.get(rid))
            lens.append(n)
        pages = self.pools.alloc_extend_pages(
            [r.seq_tokens for r in reqs], [r.seq_tokens + n for r, n in zip(reqs, lens)]
        )
        if pages is None:
            return False
        for req, n, new in zip(reqs, lens, pages):
            req.pages.extend(new)
            req.seq_tokens += n
        return True

    @_op
    def alloc_decode(self, rids: Sequence[Any]) -> bool:
        """One token per request; a page only at page boundaries. False when short."""
        table = self.requests.reqs
        try:
            reqs = [table[rid] for rid in rids]
        except KeyError:
            reqs = [self.requests.get(rid) for rid in rids]  # the model's error for the unknown one
        pages = self.pools.alloc_decode_pages([r.seq_tokens + 1 for r in reqs])
        if pages is None:
            return False
        for req, page in zip(reqs, pages):
            if page is not None:
                req.pages.append(page)
            req.seq_tokens += 1
        return True

    # ---- tree ops ----------------------------------------------------------------------

    def _update_hashes(self, req: ReqState, page_hashes: Sequence[int] | None) -> None:
        if page_hashes is not None:
            req.page_hashes = _held(page_hashes)

    @_op
    def checkpoint(
        self, rid: Any, up_to_tokens: int | None = None, page_hashes: Sequence[int] | None = None
    ) -> int:
        """Insert an unfinished request (chunked prefill) up to ``up_to_tokens``.

        Returns:
            the request's new ``cache_protected_len`` (page-aligned).
        """
        req = self.requests.get(rid)
        self._update_hashes(req, page_hashes)
        up_to = req.seq_tokens if up_to_tokens is None else up_to_tokens
        return self.cache.checkpoint(req, up_to, finished=False)

    @_op
    def release(
        self,
        rid: Any,
        checkpoint: bool = True,
        up_to_tokens: int | None = None,
        page_hashes: Sequence[int] | None = None,
    ) -> None:
        """Finish (insert, then free the private row) or retract (``checkpoint=False``).

        Mutates: tree, pools, request table.
        """
        req = self.requests.get(rid)
        self._update_hashes(req, page_hashes)
        up_to = req.seq_tokens if up_to_tokens is None else up_to_tokens
        self.cache.release(req, checkpoint, up_to)
        self.requests.pop(rid)

    @_op
    def free_swa_out_of_window(self, rid: Any, pre_len: int, interval_tokens: int = 1) -> int:
        """Free the request's SWA below the window (decode-time release).

        Returns:
            SWA tokens freed.
        """
        return self.cache.free_swa_out_of_window(self.requests.get(rid), pre_len, interval_tokens)

    @_op
    def evict(self, full_tokens: int = 0, swa_tokens: int = 0) -> EvictResult:
        """Evict for an allocation shortfall of ``full_tokens`` / ``swa_tokens``."""
        return self.cache.evict(full_tokens, swa_tokens)

    @_op
    def make_room(self, full_tokens: int = 0, swa_tokens: int = 0) -> EvictResult:
        """Evict only the shortfall between what is needed and what is available."""
        full_short = max(0, full_tokens - self.pools.full_available_tokens())
        swa_short = max(0, swa_tokens - self.pools.swa_available_tokens()) if self.pools.has_swa else 0
        return self.cache.evict(full_short, swa_short)

    @_op
    def evict_host(self, full_tokens: int = 0, swa_tokens: int = 0) -> EvictResult:
        """Free host slots (HiCache)."""
        return self.cache.evict_host(full_tokens, swa_tokens)

    @_op
    def ack_write_through(self) -> int:
        """Acknowledge the pending write-through backups (``hicache_write_ack=next_step``):
        release their locks. Returns how many there were (0 without a radix tree)."""
        tree = self.cache.tree
        return tree.ack_write_through() if tree is not None else 0

    @_op
    def free_group_begin(self) -> None:
        """Defer device frees until ``free_group_end`` (occupancy lags meanwhile)."""
        self.pools.free_group_begin()

    @_op
    def free_group_end(self) -> None:
        """Release every device free deferred since ``free_group_begin``."""
        self.pools.free_group_end()

    # ---- state -------------------------------------------------------------------------

    def request(self, rid: Any) -> ReqState:
        """The running request ``rid`` (read-only use)."""
        return self.requests.get(rid)

    def snapshot(self) -> dict[str, PoolSnapshot]:
        """Per-pool capacity / available / evictable / protected / held, in tokens."""
        return {row[0]: PoolSnapshot(*row[1:]) for row in self.occupancy_rows()}

    def occupancy_rows(self) -> list[tuple[str, int, int, int, int, int]]:
        """``snapshot`` as plain tuples (name, capacity, available, evictable, protected,
        held), pools in the same order: the per-step stats sample builds no objects."""
        full = self.pools.full
        cache = self.cache
        ev, prot = cache.full_ledger()
        cap, avail = full.capacity_tokens, full.available_tokens()
        out = [("full", cap, avail, ev, prot, cap - avail - ev - prot)]
        if self.pools.has_swa:
            swa = self.pools.swa
            ev, prot = cache.swa_ledger()
            cap, avail = swa.capacity_tokens, swa.available_tokens()
            out.append(("swa", cap, avail, ev, prot, cap - avail - ev - prot))
        if self.host_full is not None or self.host_swa is not None:
            host_full, host_swa = cache.host_tokens()
            for name, pool, owned in (("host_full", self.host_full, host_full),
                                      ("host_swa", self.host_swa, host_swa)):
                if pool is not None:
                    cap, avail = pool.capacity_tokens, pool.available_tokens()
                    out.append((name, cap, avail, owned, 0, cap - avail - owned))
        return out

    def check_integrity(self) -> dict[str, PoolSnapshot]:
        """Check every pool, the tree and every request; return the snapshot.

        Raises:
            IntegrityError: on a leak, a double owner, a ledger drift or a broken identity.
        """
        from replay.memory.integrity import check_model  # torch: imported only when checking

        return check_model(self)

    def stats(self) -> dict[str, int]:
        """CPU-cost counters: elements concatenated and merges per pool."""
        out = {
            "full_cat_elems": self.pools.full.num_cat_elems,
            "full_merges": self.pools.full.num_merges,
        }
        if self.pools.has_swa:
            out["swa_cat_elems"] = self.pools.swa.num_cat_elems
            out["swa_merges"] = self.pools.swa.num_merges
            out["unmapped_swa_frees"] = self.pools.num_unmapped_swa_frees
        for name, pool in (("host_full", self.host_full), ("host_swa", self.host_swa)):
            if pool is not None:
                out[f"{name}_cat_elems"] = pool.num_cat_elems
                out[f"{name}_merges"] = pool.num_merges
        return out



def _held(page_hashes: Sequence[int]) -> list[int]:
    """What a request keeps of the hashes a caller gave: a copy, unless they are a
    ``GrowingKeys`` (append-only: the pages it holds never change, and the model reads only
    ``[:pages]`` of it, after checking its length), which it keeps as it is (a finish or a
    checkpoint copied a request's whole key list, 1 % of a production hour's replay)."""
    return page_hashes if type(page_hashes) is GrowingKeys else list(page_hashes)


__all__ = ["KVCacheModel", "MemoryModelError"]
