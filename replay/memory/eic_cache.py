"""EIC-style cache (the bytedance fork's external-cache rule, DESIGN.md §4.4).

The tree owns FULL only: no SWA ledger, locks or tombstones (``swa_evictable`` = 0). The SWA
peers of tree pages stay mapped to them (tree-pinned) until the FULL page is evicted, which
frees both. A running request may release the page-aligned out-of-window SWA *below*
``cache_protected_len`` (``release_cache_protected_prefix``): the floor is ignored. On reuse,
SWA missing within one window above the match is restored from the host copy (the match
reports it as ``swa_host_hit_tokens``; ``load_back`` allocates it).
"""

from __future__ import annotations

from replay.memory.config import MemoryConfig
from replay.memory.radix_cache import RadixCache
from replay.memory.requests import ReqState
from replay.memory.results import MatchResult


class EICCache(RadixCache):
    """Radix cache whose tree owns FULL only.

    Args:
        cfg: model config (must have an SWA pool).
        pools: ``SWAKVPools``.
    """

    def __init__(self, cfg: MemoryConfig, pools):
        super().__init__(cfg, pools, swa_component=False)

    def swa_ledger(self) -> tuple[int, int]:
        """The fork reports no SWA state in the tree."""
        return 0, 0

    def _window_pages(self, pages: list[int], end_tokens: int) -> list[int]:
        start = max(0, end_tokens - self.cfg.sliding_window_tokens) // self.ps
        return pages[start : end_tokens // self.ps]

    match_limit = False  # ``match`` takes the key already cut

    def match(self, key: list[int]) -> MatchResult:
        """FULL-only match; ``swa_host_hit_tokens`` counts window pages without SWA peers."""
        m = self.tree.match(key)
        m.swa_host_hit_tokens = self.missing_swa_tokens(m)
        return m

    def missing_swa_tokens(self, m: MatchResult) -> int:
        """Tokens of the window above ``m``'s device prefix whose SWA peer is gone (read live)."""
        window = self._window_pages(m.prefix_pages, m.device_hit_tokens)
        return sum(1 for s in self.pools.translate(window) if s == 0) * self.ps

    def load_back(self, req: ReqState) -> int:
        """Restore missing SWA within one window above the prefix from the host copy.

        Returns:
            SWA tokens restored (0 when nothing is missing or the SWA pool stays short).
        Mutates: SWA pool, mapping; may evict FULL leaves for SWA room.
        """
        window = self._window_pages(req.pages, req.protected_tokens)
        missing = [p for p, s in zip(window, self.pools.translate(window)) if s == 0]
        if not missing:
            return 0
        need = len(missing) * self.ps - self.pools.swa_available_tokens()
        if need > 0:
            self.tree.evict(swa_tokens=need)
        if self.pools.swa.available_pages() < len(missing):
            return 0
        self.pools.alloc_swa_for(missing)
        if req.match is not None:
            req.match.swa_host_hit_tokens = 0
        return len(missing) * self.ps

    def swa_dead_lo(self, req: ReqState) -> int:
        """``release_cache_protected_prefix``: the protected floor does not apply."""
        return 0

    def pinned_swa_pages(self) -> list[int]:
        """SWA pages mapped to tree-owned full pages (held by the tree, not in a ledger)."""
        full = []
        for node in self.tree._walk():
            if node.full is not None:
                full.extend(node.full)
        return [s for s in self.pools.translate(full) if s > 0]
