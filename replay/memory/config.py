"""Frozen configuration of the reference memory model.

Every knob of DESIGN.md §5 that the pools and the tree implement is a field here, named as in
the one knob table (:mod:`replay.knobs`), which also supplies the allowed values; names carry
units. Values are validated at construction, so a bad knob fails before any state exists.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from replay import knobs

#: ``append`` (freed slots go to the tail, sglang's token allocator) is a model-only value.
DEVICE_FREE_MODES = knobs.values_of("device_free") + ("append",)
HOST_FREE_MODES = knobs.values_of("host_free")
SWA_LRU_REFRESH_MODES = knobs.values_of("swa_lru_refresh")
HICACHE_WRITE_POLICIES = knobs.values_of("hicache_write_policy")
SWA_RELEASE_BOUNDARIES = knobs.values_of("swa_release_boundary")
SWA_OUT_OF_WINDOW_RELEASES = knobs.values_of("swa_out_of_window_release")
CACHE_KINDS = ("radix", "chunk", "eic")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class MemoryConfig:
    """All knobs of the memory model.

    Attributes:
        page_size: tokens per page (1 = token allocator).
        full_pool_tokens: capacity of the full-attention device pool (page-aligned down).
        sliding_window_tokens: SWA retain window W; 0 = no SWA pool, no SWA component.
        swa_pool_tokens: capacity of the SWA device pool (used only when W > 0).
        host_pool_tokens: HiCache host pool for full KV; 0 = no HiCache.
        swa_host_pool_tokens: HiCache host pool for SWA KV; None = same as host_pool_tokens.
        cache_kind: ``radix`` (prefix sharing), ``chunk`` (no sharing) or ``eic`` (tree owns
            FULL only; SWA restored from the external host copy on reuse).
        device_free: ``prepend`` (paged allocator: freed pages reused first), ``append``
            (token allocator: freed slots go to the tail) or ``sorted_merge`` (staged, merged and
            sorted when an allocation runs short; SGLang's ``need_sort``).
        host_free: ``eager_cat`` (every free concatenates onto the whole free list) or
            ``lazy_merge`` (released chunks merged only when an allocation runs short).
        swa_lru_refresh: ``full_ancestry`` or ``window_aware`` (sgl-project/sglang#26615).
        eviction_policy: FULL eviction strategy name or ``"pkg.mod:Class"`` import path.
        hicache_write_policy: ``write_through`` (threshold 1), ``write_through_selective``
            (threshold 2) or ``write_back`` (backup only at eviction).
        load_back_threshold_tokens: host hits below this many tokens are not loaded back.
        swa_release_boundary: out-of-window release boundary for radix caches:
            ``window_plus_page_cut_to_window`` (pre-#29860: keep W) or ``max_window_page``
            (keep ceil(max(W, ps)) to a page).
        swa_out_of_window_release: ``off``, ``decode_only`` or ``decode_and_unfinished_insert``
            (also free out-of-window SWA before inserting an unfinished request,
            sgl-project/sglang#27402; on by default in 0.5.23). The memory model applies the
            at-insert part (:attr:`swa_free_at_unfinished_insert`); the decode cadence is the
            scheduler's.
        hicache_write_ack: ``immediate`` (a write-through backup is done when it returns) or
            ``next_step`` (as SGLang acknowledges it: the backup locks its node and stays
            pending until :meth:`KVCacheModel.ack_write_through`, which a scheduler calls once
            per step). Model-only, not a knob.
        debug_check_every_op: run ``check_integrity()`` after every public operation.
    """

    page_size: int = 1
    full_pool_tokens: int = 4096
    sliding_window_tokens: int = 0
    swa_pool_tokens: int = 0
    host_pool_tokens: int = 0
    swa_host_pool_tokens: int | None = None
    cache_kind: str = "radix"
    device_free: str = "prepend"
    host_free: str = "lazy_merge"
    swa_lru_refresh: str = "window_aware"
    eviction_policy: str = "lru"
    hicache_write_policy: str = "write_through"
    load_back_threshold_tokens: int = 10
    swa_release_boundary: str = "max_window_page"
    swa_out_of_window_release: str = "decode_and_unfinished_insert"
    hicache_write_ack: str = "immediate"
    debug_check_every_op: bool = False

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.full_pool_tokens < self.page_size:
            raise ValueError("full_pool_tokens must hold at least one page")
        if self.sliding_window_tokens < 0:
            raise ValueError("sliding_window_tokens must be >= 0")
        if self.sliding_window_tokens > 0 and self.swa_pool_tokens < self.page_size:
            raise ValueError("an SWA model needs swa_pool_tokens >= page_size")
        if self.host_pool_tokens < 0:
            raise ValueError("host_pool_tokens must be >= 0")
        if self.cache_kind == "eic" and self.sliding_window_tokens == 0:
            raise ValueError("cache_kind='eic' needs an SWA model (sliding_window_tokens > 0)")
        _choice("cache_kind", self.cache_kind, CACHE_KINDS)
        _choice("device_free", self.device_free, DEVICE_FREE_MODES)
        _choice("host_free", self.host_free, HOST_FREE_MODES)
        _choice("swa_lru_refresh", self.swa_lru_refresh, SWA_LRU_REFRESH_MODES)
        _choice("hicache_write_policy", self.hicache_write_policy, HICACHE_WRITE_POLICIES)
        _choice("hicache_write_ack", self.hicache_write_ack, ("immediate", "next_step"))
        _choice("swa_release_boundary", self.swa_release_boundary, SWA_RELEASE_BOUNDARIES)
        _choice("swa_out_of_window_release", self.swa_out_of_window_release, SWA_OUT_OF_WINDOW_RELEASES)
        from replay.memory.policies import POLICIES

        if self.eviction_policy not in POLICIES.names():
            try:
                knobs.knob("eviction_policy").parse(self.eviction_policy)
            except knobs.KnobError as e:
                raise ValueError(str(e)) from None

    @property
    def swa_free_at_unfinished_insert(self) -> bool:
        """Free out-of-window SWA before inserting an unfinished request (#27402)."""
        return self.swa_out_of_window_release == "decode_and_unfinished_insert"

    @property
    def has_swa(self) -> bool:
        """Whether the model has a sliding-window pool."""
        return self.sliding_window_tokens > 0

    @property
    def has_hicache(self) -> bool:
        """Whether a host (L2) pool backs the tree."""
        return self.host_pool_tokens > 0 and self.cache_kind == "radix"

    @property
    def write_through_threshold(self) -> int:
        """Hit count at which write-through backs a node up (1, or 2 for selective)."""
        return 2 if self.hicache_write_policy == "write_through_selective" else 1

    @property
    def resolved_swa_host_pool_tokens(self) -> int:
        """SWA host pool size after applying the default."""
        if self.swa_host_pool_tokens is None:
            return self.host_pool_tokens
        return self.swa_host_pool_tokens

    def to_dict(self) -> dict:
        """The resolved config as a plain dict (saved with every result)."""
        return asdict(self)
