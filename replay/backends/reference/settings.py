"""Settings of the reference backend: the knob table's names, validated for this backend.

Same fields as the real backend's :class:`replay.backends.sglang.settings.SglangSettings` (both
take the one knob table, :mod:`replay.knobs`), plus what only the model expresses:
``prefix_ownership=eic_release_protected_prefix`` and eviction plug-ins by ``pkg.mod:Class``.
``tree_core`` is accepted and ignored (the model has one tree).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from replay import knobs
from replay.memory import MemoryConfig


@dataclass(frozen=True)
class ReferenceSettings:
    """Configuration of one reference run (every field is a knob of :mod:`replay.knobs`)."""

    swa_lru_refresh: str = "window_aware"
    swa_admission: str = "shrink_never_fits"
    host_free: str = "lazy_merge"
    swa_out_of_window_release: str = "decode_and_unfinished_insert"
    swa_release_boundary: str = "max_window_page"
    prefix_ownership: str = "radix_protected_floor"
    eviction_policy: str = "lru"
    device_free: str = "prepend"
    page_size: int = 16
    sliding_window_tokens: int = 128
    full_pool_tokens: int = 262144
    swa_pool_tokens: int = 0
    swa_full_tokens_ratio: float = 0.25
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 64
    host_pool_tokens: int = 0
    hicache_write_policy: str = "write_through"
    schedule_policy: str = "fcfs"
    swa_eviction_interval_tokens: int = 128
    tree_core: str = "auto"
    max_context_tokens: int = 0
    step_fixed_ns: int = 5_000_000
    step_per_token_ns: int = 20_000

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                knobs.knob(f.name).parse(getattr(self, f.name))
            except knobs.KnobError as e:
                raise ValueError(str(e)) from None
        knobs.check_backend(self.to_dict(), "reference")
        if self.schedule_policy != "fcfs":
            raise ValueError(f"schedule_policy={self.schedule_policy}: the reference backend schedules fcfs "
                             "only; use --backend sglang")
        if self.full_pool_tokens % self.page_size:
            raise ValueError(f"full_pool_tokens={self.full_pool_tokens} is not a multiple of "
                             f"page_size={self.page_size}")
        if self.has_swa and self.swa_tokens < 2 * self.page_size:
            raise ValueError(f"SWA pool of {self.swa_tokens} tokens is too small for page_size {self.page_size}")
        if self.has_swa and self.sliding_window_tokens >= self.swa_tokens:
            raise ValueError(f"sliding_window_tokens={self.sliding_window_tokens} does not fit the SWA pool "
                             f"of {self.swa_tokens} tokens; expected a window below the pool size")
        if self.host_pool_tokens and self.host_pool_tokens < self.page_size:
            raise ValueError(f"host_pool_tokens={self.host_pool_tokens} is below one page")
        if self.prefix_ownership == "eic_release_protected_prefix" and not self.has_swa:
            raise ValueError("prefix_ownership=eic_release_protected_prefix needs an SWA model "
                             "(sliding_window_tokens > 0)")

    @property
    def has_swa(self) -> bool:
        return self.sliding_window_tokens > 0

    @property
    def has_hicache(self) -> bool:
        return self.host_pool_tokens > 0

    @property
    def swa_tokens(self) -> int:
        """Resolved SWA pool size (page-aligned), 0 without SWA (as the real backend sizes it)."""
        if not self.has_swa:
            return 0
        raw = self.swa_pool_tokens or int(self.full_pool_tokens * self.swa_full_tokens_ratio)
        return (raw // self.page_size) * self.page_size

    def memory_config(self) -> MemoryConfig:
        """The :class:`replay.memory.MemoryConfig` these settings describe."""
        eic = self.prefix_ownership == "eic_release_protected_prefix"
        host = self.host_pool_tokens // self.page_size * self.page_size
        return MemoryConfig(
            page_size=self.page_size, full_pool_tokens=self.full_pool_tokens,
            sliding_window_tokens=self.sliding_window_tokens, swa_pool_tokens=self.swa_tokens,
            host_pool_tokens=0 if eic else host, cache_kind="eic" if eic else "radix",
            device_free=self.device_free, host_free=self.host_free, swa_lru_refresh=self.swa_lru_refresh,
            eviction_policy=self.eviction_policy, hicache_write_policy=self.hicache_write_policy,
            swa_release_boundary=self.swa_release_boundary,
            swa_out_of_window_release=self.swa_out_of_window_release)

    def server(self) -> dict:
        """Manifest ``server`` block (``tracer.schema.SERVER_KEYS``)."""
        return {
            "page_size": self.page_size, "sliding_window_tokens": self.sliding_window_tokens,
            "full_pool_tokens": self.full_pool_tokens, "swa_pool_tokens": self.swa_tokens,
            "swa_full_tokens_ratio": self.swa_full_tokens_ratio, "chunked_prefill_size": self.chunked_prefill_size,
            "cache_kind": "eic" if self.prefix_ownership == "eic_release_protected_prefix" else "unified_radix",
            "host_pool_tokens": self.host_pool_tokens,
            "hicache_write_policy": self.hicache_write_policy if self.has_hicache else "",
            "max_prefill_tokens": self.max_prefill_tokens, "max_running_requests": self.max_running_requests,
            "eviction_policy": self.eviction_policy, "schedule_policy": self.schedule_policy,
            "model": "kvtrace-reference-backend", "sglang_version": "",
        }

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def from_knobs(values: dict[str, object]) -> ReferenceSettings:
    """Settings from resolved knob values (:func:`replay.knobs.resolve`)."""
    names = {f.name for f in fields(ReferenceSettings)}
    return ReferenceSettings(**{k: v for k, v in values.items() if k in names})


__all__ = ["ReferenceSettings", "from_knobs"]
