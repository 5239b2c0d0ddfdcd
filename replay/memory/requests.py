"""Request-side KV rows: what each running request holds and how its row grows and shrinks.

A row is the request's list of full page ids, one per page of its KV (SGLang's
``req_to_token`` row at page granularity). ``pages[:protected_tokens // ps]`` are tree-owned
(``cache_protected_len``); the rest, including a partial last page, is request-private.
SWA of the private pages below ``swa_evicted_tokens`` has been freed (out-of-window release).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replay.memory.results import MemoryModelError


@dataclass
class ReqState:
    """One running request.

    Attributes:
        rid: request id.
        page_hashes: hashes of the request's pages so far (key for inserts).
        pages: full page ids of the KV row.
        seq_tokens: tokens with KV allocated.
        protected_tokens: tree-owned prefix (page-aligned; SGLang ``cache_protected_len``).
        swa_evicted_tokens: SWA freed below this (page-aligned).
        swa_released_tokens: SWA slots freed out of window so far (``release_out_of_window``; the
            evicted length also moves where nothing is freed: its lift to the dead floor).
        inserted_tokens: tokens already inserted by this request (``cache_inserted_len``).
        priority: request priority (for the ``priority`` eviction policy).
        swa_branching_tokens: pending SWA branching point from the match, if any.
        lock: tree lock receipt (None for the chunk cache).
        match: the MatchResult the request was admitted with.
        prompt_tokens: prompt length, if known (FULL-only trees split the leaf there).
    """

    rid: Any
    page_hashes: list[int]
    pages: list[int] = field(default_factory=list)
    seq_tokens: int = 0
    protected_tokens: int = 0
    swa_evicted_tokens: int = 0
    swa_released_tokens: int = 0
    inserted_tokens: int = 0
    priority: int = 0
    swa_branching_tokens: int | None = None
    lock: Any = None
    match: Any = None
    prompt_tokens: int | None = None

    def private_pages(self, page_size: int) -> list[int]:
        """Pages not owned by the tree."""
        return self.pages[self.protected_tokens // page_size :]


class RequestTable:
    """All running requests, keyed by rid."""

    def __init__(self) -> None:
        self.reqs: dict[Any, ReqState] = {}

    def add(self, req: ReqState) -> None:
        """Register a new request. Raises MemoryModelError on a duplicate rid."""
        if req.rid in self.reqs:
            raise MemoryModelError(f"request {req.rid!r} is already running")
        self.reqs[req.rid] = req

    def get(self, rid: Any) -> ReqState:
        """The running request ``rid``. Raises MemoryModelError when unknown."""
        req = self.reqs.get(rid)
        if req is None:
            raise MemoryModelError(f"unknown request {rid!r}")
        return req

    def pop(self, rid: Any) -> ReqState:
        """Remove and return ``rid``."""
        req = self.get(rid)
        del self.reqs[rid]
        return req

    def __iter__(self):
        return iter(self.reqs.values())

    def __len__(self) -> int:
        return len(self.reqs)


def free_row(pools, req: ReqState, page_size: int) -> tuple[int, int]:
    """Free the request-private part of a row.

    Pages below the SWA-evicted cursor go back full-only (their SWA is gone); the rest on
    both sides (SWA first).

    Returns:
        (full tokens freed, SWA tokens freed).
    Mutates: pools (or their open free group), ``req.pages`` truncated to the tree prefix.
    """
    lo = req.protected_tokens // page_size
    dead_hi = max(req.swa_evicted_tokens // page_size, lo)
    private = req.pages[lo:]
    full_only = private[: dead_hi - lo]
    both = private[dead_hi - lo :]
    pools.free_full_only(full_only)
    swa_freed = 0
    if both:
        swa_freed = pools.free_swa_of(both) * page_size if pools.has_swa else 0
        pools.full.free_page_ids(both)
    del req.pages[lo:]
    return len(private) * page_size, swa_freed


def release_out_of_window(
    pools, req: ReqState, page_size: int, pre_len: int, window: int, threshold: int,
    dead_lo: int, interval: int = 1,
) -> int:
    """Free the request's SWA below the window (SGLang ``free_swa_out_of_window_slots``).

    Args:
        pre_len: tokens already computed (the position before the new token).
        window: W.
        threshold: the boundary below which SWA may go (cache-specific).
        dead_lo: the floor nothing below which is freed (cache-specific).
        interval: free only when at least this many tokens left the window.
    Returns:
        SWA tokens freed.
    Mutates: ``req.swa_evicted_tokens``, the SWA pool and the mapping.
    """
    if pre_len - window < req.swa_evicted_tokens + interval:
        return 0
    evicted = max(req.swa_evicted_tokens, dead_lo)
    if evicted % page_size:
        evicted += page_size - evicted % page_size
    req.swa_evicted_tokens = evicted
    new = max(evicted, threshold) // page_size * page_size
    if new <= evicted:
        return 0
    freed = pools.free_swa_of(req.pages[evicted // page_size : new // page_size]) * page_size
    req.swa_evicted_tokens = new
    req.swa_released_tokens += freed
    return freed
