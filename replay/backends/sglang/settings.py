"""Settings of the real-code sglang backend: one frozen dataclass, saved with every result.

Every field is either a constructor argument / ``ServerArgs`` field of the real classes, an
``SGLANG_*`` environment switch of sglang 0.5.23 (set only while the backend runs), or a policy
knob of DESIGN.md §5 that 0.5.23 has no switch for and that ``replay.backends.sglang.patches``
adds as a small patch over the real class (``swa_lru_refresh``, ``host_free``,
``swa_release_boundary``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, fields

#: Allowed values of the enumerated settings (the first is the 0.5.23 behaviour).
CHOICES: dict[str, tuple[str, ...]] = {
    "tree_core": ("rust", "python"),
    "hicache_write_policy": ("write_through", "write_through_selective", "write_back"),
    "eviction_policy": ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"),
    "schedule_policy": ("fcfs", "lof", "random", "lpm", "dfs-weight"),
    "swa_lru_refresh": ("window_aware", "full_ancestry"),
    "host_free": ("lazy_merge", "eager_cat"),
    "swa_release_boundary": ("max_window_page", "window_plus_page_cut_to_window"),
}


@dataclass(frozen=True)
class SglangSettings:
    """Configuration of one real-code backend run.

    Attributes:
        page_size: tokens per KV page (allocator and tree).
        sliding_window_tokens: SWA window W; 0 builds a FULL-only tree (no SWA pool).
        full_pool_tokens: slots of the full device pool.
        swa_pool_tokens: slots of the SWA device pool; 0 = ``full_pool_tokens * swa_full_tokens_ratio``.
        swa_full_tokens_ratio: SWA/full pool size ratio used when ``swa_pool_tokens`` is 0.
        chunked_prefill_size: tokens per prefill chunk (``--chunked-prefill-size``).
        max_prefill_tokens: prefill token budget per step (``--max-prefill-tokens``).
        max_running_requests: running batch cap (``--max-running-requests``).
        max_context_tokens: request row width; 0 = derived from the workload.
        host_pool_tokens: HiCache full host pool slots; 0 disables HiCache. The SWA host pool
            gets the same host/device ratio.
        hicache_write_policy: ``--hicache-write-policy``.
        eviction_policy: ``--radix-eviction-policy``.
        schedule_policy: ``--schedule-policy``.
        tree_core: UnifiedRadixCache tree core (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``).
        swa_eviction_interval_tokens: ``SGLANG_SWA_EVICTION_INTERVAL``.
        swa_free_out_of_window_at_insert: ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``.
        need_sort: device allocator ``need_sort`` (sorted free-list merge).
        swa_lru_refresh: patch knob (#26615); ``full_ancestry`` needs ``tree_core=python``.
        host_free: patch knob (#30658); ``eager_cat`` merges the host free list on every free.
        swa_release_boundary: patch knob (#29860); the pre-fix boundary keeps only W.
        step_fixed_ns: virtual-clock cost of one forward step.
        step_per_token_ns: virtual-clock cost per token run in a step.
    """

    page_size: int = 16
    sliding_window_tokens: int = 128
    full_pool_tokens: int = 262144
    swa_pool_tokens: int = 0
    swa_full_tokens_ratio: float = 0.25
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 64
    max_context_tokens: int = 0
    host_pool_tokens: int = 0
    hicache_write_policy: str = "write_through"
    eviction_policy: str = "lru"
    schedule_policy: str = "fcfs"
    tree_core: str = "rust"
    swa_eviction_interval_tokens: int = 128
    swa_free_out_of_window_at_insert: bool = True
    need_sort: bool = False
    swa_lru_refresh: str = "window_aware"
    host_free: str = "lazy_merge"
    swa_release_boundary: str = "max_window_page"
    step_fixed_ns: int = 5_000_000
    step_per_token_ns: int = 20_000

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
        positive = ("page_size", "full_pool_tokens", "chunked_prefill_size", "max_prefill_tokens",
                    "max_running_requests", "swa_eviction_interval_tokens")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("sliding_window_tokens", "swa_pool_tokens", "max_context_tokens",
                     "host_pool_tokens", "step_fixed_ns", "step_per_token_ns"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.full_pool_tokens % self.page_size:
            raise ValueError(f"full_pool_tokens={self.full_pool_tokens} is not a multiple of "
                             f"page_size={self.page_size}")
        if self.has_swa and self.swa_tokens < 2 * self.page_size:
            raise ValueError(f"SWA pool of {self.swa_tokens} tokens is too small for page_size "
                             f"{self.page_size}")
        if self.swa_lru_refresh == "full_ancestry" and self.tree_core != "python":
            raise ValueError("swa_lru_refresh=full_ancestry patches the Python tree core; "
                             "also set tree_core=python")
        if self.host_pool_tokens and self.host_pool_tokens < self.page_size:
            raise ValueError(f"host_pool_tokens={self.host_pool_tokens} is below one page")

    @property
    def has_swa(self) -> bool:
        return self.sliding_window_tokens > 0

    @property
    def has_hicache(self) -> bool:
        return self.host_pool_tokens > 0

    @property
    def swa_tokens(self) -> int:
        """Resolved SWA pool size (page-aligned), 0 without SWA."""
        if not self.has_swa:
            return 0
        raw = self.swa_pool_tokens or int(self.full_pool_tokens * self.swa_full_tokens_ratio)
        return (raw // self.page_size) * self.page_size

    def env(self) -> dict[str, str]:
        """``SGLANG_*`` environment switches this run sets while it runs."""
        return {
            "SGLANG_SWA_EVICTION_INTERVAL": str(self.swa_eviction_interval_tokens),
            "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS": str(self.swa_free_out_of_window_at_insert).lower(),
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": self.tree_core,
        }

    def server(self, *, sglang_version: str = "") -> dict:
        """Manifest ``server`` block (``tracer.schema.SERVER_KEYS``)."""
        return {
            "page_size": self.page_size,
            "sliding_window_tokens": self.sliding_window_tokens,
            "full_pool_tokens": self.full_pool_tokens,
            "swa_pool_tokens": self.swa_tokens,
            "swa_full_tokens_ratio": self.swa_full_tokens_ratio,
            "chunked_prefill_size": self.chunked_prefill_size,
            "cache_kind": "unified_radix",
            "host_pool_tokens": self.host_pool_tokens,
            "hicache_write_policy": self.hicache_write_policy if self.has_hicache else "",
            "max_running_requests": self.max_running_requests,
            "eviction_policy": self.eviction_policy,
            "model": "kvtrace-sglang-backend",
            "sglang_version": sglang_version,
        }

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def setting_names() -> list[str]:
    return [f.name for f in fields(SglangSettings)]


def _coerce(name: str, raw: str, typ) -> object:
    if typ is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}={raw!r}: expected true/false")
    try:
        if typ is int:
            return int(raw.replace("_", ""))
        if typ is float:
            return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {typ.__name__}") from None
    return raw


def parse_overrides(items: typing.Iterable[str], base: SglangSettings | None = None) -> SglangSettings:
    """Build settings from ``key=value`` strings (``--set`` on the command line).

    Args:
        items: ``key=value`` strings.
        base: settings to override (default: the defaults).
    Returns:
        the new settings.
    Raises:
        ValueError: malformed item, unknown key (message lists the valid keys) or bad value.
    """
    hints = typing.get_type_hints(SglangSettings)
    changes: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"--set {item!r}: expected key=value")
        if key not in hints:
            raise ValueError(f"unknown setting {key!r}; valid settings: {', '.join(setting_names())}")
        changes[key] = _coerce(key, raw.strip(), hints[key])
    return dataclasses.replace(base or SglangSettings(), **changes)


__all__ = ["CHOICES", "SglangSettings", "parse_overrides", "setting_names"]
