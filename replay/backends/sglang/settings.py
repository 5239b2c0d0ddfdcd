"""Settings of the real-code sglang backend: one frozen dataclass, saved with every result.

Field names, allowed values and defaults come from the one knob table, :mod:`replay.knobs`
(DESIGN.md §5). Each knob maps to a constructor argument / ``ServerArgs`` field of the real
classes, an ``SGLANG_*`` environment switch of sglang 0.5.23 (set only while the backend runs),
or a small listed patch over the real class (``replay.backends.sglang.patches``) where 0.5.23
has no switch (``swa_lru_refresh``, ``swa_admission``, ``host_free``, ``swa_release_boundary``).
``prefix_ownership=eic_release_protected_prefix`` and eviction plug-ins are refused: only the
reference backend expresses them.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, fields

from replay import knobs

#: Allowed values of the enumerated settings (from the knob table).
CHOICES: dict[str, tuple[str, ...]] = {k.name: k.values for k in knobs.KNOBS if k.values}

#: ``swa_out_of_window_release=off`` turns the decode cadence off with an interval no request reaches.
_NEVER_TOKENS = 1 << 40


@dataclass(frozen=True)
class SglangSettings:
    """Configuration of one real-code backend run.

    Every field is a knob of :mod:`replay.knobs` (``kvtrace policies`` lists them with help and
    the upstream change each stands for). How each reaches the real code:

    - ``swa_lru_refresh=full_ancestry``: patch (pre-#26615), Python tree core (``tree_core=auto``
      picks it);
    - ``swa_admission``: patch of ``SWAPrefillBudget.swa_never_fits`` (``all_or_nothing``: never
      shrink; ``shrink_always``: shrink whenever the SWA need does not fit;
      ``shrink_never_fits``: 0.5.23's own gate, #32700);
    - ``host_free=eager_cat``: patch (pre-#30658); ``device_free``: the allocators' ``need_sort``;
    - ``swa_out_of_window_release``: ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``
      (at unfinished inserts) and ``SGLANG_SWA_EVICTION_INTERVAL`` (decode cadence; ``off`` sets
      an interval no request reaches);
    - ``swa_release_boundary=window_plus_page_cut_to_window``: patch (pre-#29860);
    - sizes: constructor arguments of the real pools, allocators and ``PrefillAdder``;
    - ``step_fixed_ns`` / ``step_per_token_ns``: the virtual clock's step-cost model.
    """

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
    scheduler: str = "mirror"
    max_context_tokens: int = 0
    step_fixed_ns: int = 5_000_000
    step_per_token_ns: int = 20_000

    def __post_init__(self) -> None:
        for f in fields(self):
            k = knobs.knob(f.name)
            try:
                k.parse(getattr(self, f.name))
            except knobs.KnobError as e:
                raise ValueError(str(e)) from None
        knobs.check_backend({f.name: getattr(self, f.name) for f in fields(self)}, "sglang")
        if self.full_pool_tokens % self.page_size:
            raise ValueError(f"full_pool_tokens={self.full_pool_tokens} is not a multiple of "
                             f"page_size={self.page_size}")
        if self.has_swa and self.swa_tokens < 2 * self.page_size:
            raise ValueError(f"SWA pool of {self.swa_tokens} tokens is too small for page_size "
                             f"{self.page_size}")
        if self.has_swa and self.sliding_window_tokens >= self.swa_tokens:
            raise ValueError(f"sliding_window_tokens={self.sliding_window_tokens} does not fit the SWA pool "
                             f"of {self.swa_tokens} tokens; expected a window below the pool size")
        if self.swa_lru_refresh == "full_ancestry" and self.resolved_tree_core != "python":
            raise ValueError("swa_lru_refresh=full_ancestry patches the Python tree core; "
                             "set tree_core=python (or auto)")
        if self.host_pool_tokens and self.host_pool_tokens < self.page_size:
            raise ValueError(f"host_pool_tokens={self.host_pool_tokens} is below one page")

    @property
    def resolved_tree_core(self) -> str:
        """The tree core the run builds: ``auto`` is rust, python for full-ancestry refresh."""
        if self.tree_core != "auto":
            return self.tree_core
        return "python" if self.swa_lru_refresh == "full_ancestry" else "rust"

    @property
    def need_sort(self) -> bool:
        """The device allocators' ``need_sort`` (``device_free=sorted_merge``)."""
        return self.device_free == "sorted_merge"

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
        release = self.swa_out_of_window_release
        interval = _NEVER_TOKENS if release == "off" else self.swa_eviction_interval_tokens
        return {
            "SGLANG_SWA_EVICTION_INTERVAL": str(interval),
            "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS":
                str(release == "decode_and_unfinished_insert").lower(),
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": self.resolved_tree_core,
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
            "max_prefill_tokens": self.max_prefill_tokens,
            "max_running_requests": self.max_running_requests,
            "eviction_policy": self.eviction_policy,
            "schedule_policy": self.schedule_policy,
            "model": "kvtrace-sglang-backend",
            "sglang_version": sglang_version,
        }

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def setting_names() -> list[str]:
    return [f.name for f in fields(SglangSettings)]


def parse_overrides(items: typing.Iterable[str], base: SglangSettings | None = None) -> SglangSettings:
    """Build settings from ``key=value`` strings (``--set``), by the knob table's names.

    Raises:
        ValueError: malformed item, unknown key (message lists the valid keys) or bad value.
    """
    return dataclasses.replace(base or SglangSettings(), **knobs.parse_sets(items))


def from_knobs(values: dict[str, object]) -> SglangSettings:
    """Settings from resolved knob values (:func:`replay.knobs.resolve`)."""
    names = {f.name for f in fields(SglangSettings)}
    return SglangSettings(**{k: v for k, v in values.items() if k in names})


def setting_names() -> list[str]:
    return [f.name for f in fields(SglangSettings)]


__all__ = ["CHOICES", "SglangSettings", "from_knobs", "parse_overrides", "setting_names"]
