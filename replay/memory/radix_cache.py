"""Request-level radix cache: match/admit, checkpoint (insert), release, SWA release rules.

Wraps ``RadixTree`` in the scheduler's vocabulary (SGLang ``UnifiedRadixCache``): a request is
admitted on a match and locks its last device node; ``checkpoint`` inserts its KV up to a
length and moves the lock; ``release`` optionally checkpoints, frees the private row and
unlocks. ``ChunkCache`` and ``EICCache`` override the ownership rules.
"""

from __future__ import annotations

from replay.memory.config import MemoryConfig
from replay.memory.radix import RadixTree
from replay.memory.requests import ReqState, free_row, release_out_of_window
from replay.memory.results import MatchResult, MemoryModelError


class RadixCache:
    """Prefix-sharing cache over a ``RadixTree``.

    Args:
        cfg: the model config.
        pools: device pools.
        host_full / host_swa: HiCache host pools or None.
        swa_component: whether the tree tracks SWA (False for EIC).
    """

    sharing = True

    def __init__(self, cfg: MemoryConfig, pools, host_full=None, host_swa=None, swa_component=True):
        self.cfg = cfg
        self.pools = pools
        self.ps = cfg.page_size
        self.tree = RadixTree(
            pools,
            cfg.page_size,
            window_tokens=cfg.sliding_window_tokens,
            swa_component=swa_component,
            eviction=cfg.eviction_policy,
            swa_lru_refresh=cfg.swa_lru_refresh,
            host_full=host_full,
            host_swa=host_swa,
            write_policy=cfg.hicache_write_policy,
            write_through_threshold=cfg.write_through_threshold,
            load_back_threshold_tokens=cfg.load_back_threshold_tokens,
            defer_write_ack=cfg.hicache_write_ack == "next_step",
        )

    # ---- ledgers -----------------------------------------------------------------------

    def full_ledger(self) -> tuple[int, int]:
        """(evictable, protected) full tokens."""
        return self.tree.full_evictable, self.tree.full_protected

    def swa_ledger(self) -> tuple[int, int]:
        """(evictable, protected) SWA tokens."""
        return self.tree.swa_evictable, self.tree.swa_protected

    def host_tokens(self) -> tuple[int, int]:
        """Host (full, SWA) tokens owned by the tree."""
        return self.tree.host_full_tokens, self.tree.host_swa_tokens

    # ---- match / admit -----------------------------------------------------------------

    match_limit = True  # ``match`` takes a page limit

    def match(self, key: list[int], limit: int | None = None) -> MatchResult:
        """Prefix match of at most ``limit`` pages (mutates recency, may split)."""
        return self.tree.match(key, limit)

    def touch(self, key: list[int], limit: int | None = None) -> None:
        """``match`` for its effects only (see ``RadixTree.touch``)."""
        self.tree.touch(key, limit)

    def touch_many(self, keys: list) -> list:
        """``touch`` of each key in turn (see ``RadixTree.touch_many``); the walks' best nodes."""
        return self.tree.touch_many(keys)

    def is_fresh(self, m: MatchResult) -> bool:
        """Whether a match's device anchor is still attached and on device (at once when the
        tree has not changed since the match: its path is the one the match walked, on device
        down to the anchor, as the tree's integrity check requires of every device node)."""
        if m.tree_version is not None and m.tree_version == self.tree.version:
            return True
        node, root = m.last_device_node, self.tree.root
        while node is not root:
            parent = node.parent
            if node.full is None or parent is None or parent.children.get(node.key[0]) is not node:
                return False
            node = parent
        return self.tree.path_pages(m.last_device_node) == m.prefix_pages

    def admit(self, req: ReqState, m: MatchResult) -> None:
        """Adopt the matched prefix and lock it. Mutates: ``req``, tree locks."""
        req.match = m
        req.pages = list(m.prefix_pages)
        req.seq_tokens = req.protected_tokens = m.device_hit_tokens
        req.swa_branching_tokens = m.swa_branching_tokens
        req.lock = self.tree.lock(m.last_device_node)

    def load_back(self, req: ReqState) -> int:
        """Load the host hit of the admitted match; move the lock to the best match node.

        Returns:
            tokens added to the device prefix.
        """
        m = req.match
        if m is None or (m.host_hit_tokens == 0 and m.swa_host_hit_tokens == 0):
            return 0
        if req.seq_tokens != req.protected_tokens:
            raise MemoryModelError("load_back must run before the request extends")
        best = m.best_match_node
        if self.tree.load_back(best) is None:
            return 0
        old = req.lock
        req.lock = self.tree.lock(best)
        self.tree.unlock(old)
        req.pages = self.tree.path_pages(best)
        added = len(req.pages) * self.ps - req.protected_tokens
        req.seq_tokens = req.protected_tokens = len(req.pages) * self.ps
        m.host_hit_tokens = m.swa_host_hit_tokens = 0
        return added

    # ---- SWA out-of-window release -----------------------------------------------------

    def swa_dead_lo(self, req: ReqState) -> int:
        """Nothing below this is freed: the tree-owned prefix."""
        return req.protected_tokens

    def swa_threshold(self, pre_len: int) -> int:
        """Boundary for radix caches: keep ceil(max(W, ps)) to a page (fix) or W (pre-fix)."""
        w, ps = self.cfg.sliding_window_tokens, self.ps
        if self.cfg.swa_release_boundary == "max_window_page":
            return pre_len - (-(-max(w, ps) // ps) * ps)
        return pre_len - w

    def free_swa_out_of_window(self, req: ReqState, pre_len: int, interval: int = 1) -> int:
        """See ``requests.release_out_of_window``. Returns SWA tokens freed."""
        if not self.pools.has_swa:
            return 0
        return release_out_of_window(
            self.pools, req, self.ps, pre_len, self.cfg.sliding_window_tokens,
            self.swa_threshold(pre_len), self.swa_dead_lo(req), interval,
        )

    # ---- checkpoint / release ----------------------------------------------------------

    def checkpoint(self, req: ReqState, up_to_tokens: int, finished: bool) -> int:
        """Insert the request's KV up to ``up_to_tokens`` and move its lock (SGLang
        ``checkpoint_into_tree``). ``up_to_tokens`` is clamped to [protected, seq]: the
        tree-owned prefix never shrinks (SGLang asserts this). Returns the new
        ``protected_tokens``."""
        ps, tree = self.ps, self.tree
        up_to = max(min(up_to_tokens, req.seq_tokens), req.protected_tokens)
        branching = req.swa_branching_tokens
        if branching is not None and req.protected_tokens < branching <= up_to:
            up_to = branching
        if up_to <= 0:
            return req.protected_tokens
        if not finished and self.cfg.swa_free_at_unfinished_insert:
            self.free_swa_out_of_window(req, up_to - 1)
        num_pages = up_to // ps
        if len(req.page_hashes) < num_pages:
            raise MemoryModelError(f"request {req.rid!r}: page_hashes shorter than the insert")
        result = tree.insert(
            req.page_hashes,
            req.pages,
            prev_prefix_tokens=req.protected_tokens,
            swa_evicted_tokens=req.swa_evicted_tokens,
            inserted_tokens=req.inserted_tokens,
            priority=req.priority,
            swa_branching_tokens=branching,
            num_pages=num_pages,
            owned=req.lock.node if req.lock is not None else None,
        )
        req.inserted_tokens = max(req.inserted_tokens, num_pages * ps)
        lo = req.protected_tokens // ps
        if result.kept_tree_pages:  # else the path past ``lo`` holds the request's own pages
            req.pages[lo:num_pages] = tree.path_pages_from(result.last_node, lo)[:num_pages - lo]
        self._split_at_prompt(req, num_pages)
        old = req.lock
        req.lock = tree.lock(result.last_node) if old is None else tree.relock(old, result.last_node)
        req.protected_tokens = num_pages * ps
        if result.swa_branch_inserted:
            req.swa_branching_tokens = None
            if not finished and self.cfg.swa_free_at_unfinished_insert:
                self.free_swa_out_of_window(req, req.seq_tokens - 1)
        return req.protected_tokens

    def _split_at_prompt(self, req: ReqState, num_pages: int) -> None:
        """FULL-only trees split the leaf at the prompt boundary and raise the prompt's
        priority by one, so eviction can drop the output KV without the prompt."""
        if self.tree.swa_tree or req.prompt_tokens is None or self.cfg.cache_kind != "radix":
            return
        prompt_pages = req.prompt_tokens // self.ps
        if 0 < prompt_pages < num_pages:
            self.tree.insert(
                req.page_hashes[:prompt_pages],
                req.pages[:prompt_pages],
                prev_prefix_tokens=prompt_pages * self.ps,
                inserted_tokens=prompt_pages * self.ps,
                priority=req.priority + 1,
            )

    def release(self, req: ReqState, checkpoint: bool, up_to_tokens: int) -> None:
        """Finish (checkpoint then free) or retract (free only) a request; then unlock."""
        if checkpoint:
            self.checkpoint(req, up_to_tokens, finished=True)
        free_row(self.pools, req, self.ps)
        if req.lock is not None:
            self.tree.unlock(req.lock)
            req.lock = None

    # ---- eviction ----------------------------------------------------------------------

    def evict(self, full_tokens: int, swa_tokens: int):
        """Tree eviction for an allocation shortfall."""
        return self.tree.evict(full_tokens, swa_tokens)

    def evict_host(self, full_tokens: int, swa_tokens: int):
        """Host-tier eviction."""
        return self.tree.evict_host(full_tokens, swa_tokens)

    # ---- integrity ---------------------------------------------------------------------

    def census(self):
        """Tree census (runs the tree's own integrity check)."""
        return self.tree.check_integrity()

    def check_request(self, req: ReqState) -> None:
        """The tree-owned prefix of the row equals the locked path."""
        ps = self.ps
        if req.lock is None or req.lock.released:
            raise MemoryModelError(f"request {req.rid!r} holds no tree lock")
        path = self.tree.path_pages(req.lock.node) if req.lock.node.full is not None else None
        lo = req.protected_tokens // ps
        if path is not None and req.pages[:lo] != path[:lo]:
            raise MemoryModelError(f"request {req.rid!r}: protected row differs from its locked path")
