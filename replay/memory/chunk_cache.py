"""Chunk cache: no prefix sharing at all (SGLang ``ChunkCache``).

Nothing is ever cached: a match finds nothing, a checkpoint keeps the whole row private, a
release frees the whole row. The out-of-window SWA boundary keeps exactly one window
(``pre_len - W``) because no tree can hold an all-tombstone leaf.
"""

from __future__ import annotations

from replay.memory.config import MemoryConfig
from replay.memory.radix.integrity import TreeCensus
from replay.memory.requests import ReqState, free_row, release_out_of_window
from replay.memory.results import EvictResult, MatchResult


class ChunkCache:
    """Request-level cache without sharing.

    Args:
        cfg: model config.
        pools: device pools.
    """

    sharing = False

    def __init__(self, cfg: MemoryConfig, pools):
        self.cfg = cfg
        self.pools = pools
        self.ps = cfg.page_size
        self.tree = None

    def full_ledger(self) -> tuple[int, int]:
        """Nothing is cached."""
        return 0, 0

    def swa_ledger(self) -> tuple[int, int]:
        """Nothing is cached."""
        return 0, 0

    def host_tokens(self) -> tuple[int, int]:
        """No host tier."""
        return 0, 0

    match_limit = False  # ``match`` takes the key already cut

    def match(self, key: list[int]) -> MatchResult:
        """Always an empty match."""
        return MatchResult()

    def is_fresh(self, m: MatchResult) -> bool:
        """An empty match never goes stale."""
        return True

    def admit(self, req: ReqState, m: MatchResult) -> None:
        """Start with an empty row."""
        req.match = m

    def load_back(self, req: ReqState) -> int:
        """No host tier."""
        return 0

    def free_swa_out_of_window(self, req: ReqState, pre_len: int, interval: int = 1) -> int:
        """Free SWA below ``pre_len - W`` (page-floored). Returns SWA tokens freed."""
        if not self.pools.has_swa:
            return 0
        w = self.cfg.sliding_window_tokens
        return release_out_of_window(self.pools, req, self.ps, pre_len, w, pre_len - w, 0, interval)

    def checkpoint(self, req: ReqState, up_to_tokens: int, finished: bool) -> int:
        """Nothing is inserted; the row stays private."""
        return 0

    def release(self, req: ReqState, checkpoint: bool, up_to_tokens: int) -> None:
        """Free the whole row."""
        free_row(self.pools, req, self.ps)

    def evict(self, full_tokens: int, swa_tokens: int) -> EvictResult:
        """Nothing to evict."""
        return EvictResult()

    def evict_host(self, full_tokens: int, swa_tokens: int) -> EvictResult:
        """No host tier."""
        return EvictResult()

    def census(self) -> TreeCensus:
        """The cache owns no pages."""
        return TreeCensus()

    def check_request(self, req: ReqState) -> None:
        """Chunk-cache rows are entirely private."""
        if req.protected_tokens != 0:
            raise AssertionError(f"chunk cache request {req.rid!r} has a protected prefix")
