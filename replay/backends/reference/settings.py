"""Settings of the reference backend: the knob table's names, validated for this backend.

The knobs both backends take and their checks are :class:`replay.backends.settings.BackendSettings`
(the real backend's :class:`replay.backends.sglang.settings.SglangSettings` adds ``scheduler``);
this backend also expresses what only the model does:
``prefix_ownership=eic_release_protected_prefix`` and eviction plug-ins by ``pkg.mod:Class``.
``tree_core`` is accepted and ignored (the model has one tree).
"""

from __future__ import annotations

from dataclasses import dataclass

from replay.backends.settings import BackendSettings
from replay.memory import MemoryConfig


@dataclass(frozen=True)
class ReferenceSettings(BackendSettings):
    """Configuration of one reference run (every field is a knob of :mod:`replay.knobs`)."""

    BACKEND = "reference"

    def _check_backend(self) -> None:
        if self.schedule_policy != "fcfs":
            raise ValueError(f"schedule_policy={self.schedule_policy}: the reference backend schedules fcfs "
                             "only; use --backend sglang")
        if self.kv_stack == "dsv4" and self.page_size != 256:
            raise ValueError(f"page_size={self.page_size} with kv_stack=dsv4: DeepSeek-V4 pages are 256 tokens")
        if self.prefix_ownership == "eic_release_protected_prefix" and not self.has_swa:
            raise ValueError("prefix_ownership=eic_release_protected_prefix needs an SWA model "
                             "(sliding_window_tokens > 0)")

    def memory_config(self) -> MemoryConfig:
        """The :class:`replay.memory.MemoryConfig` these settings describe."""
        eic = self.prefix_ownership == "eic_release_protected_prefix"
        # HiCache host pools as sglang sizes them: each device pool times ``hicache_ratio``
        # (host_pool_tokens / full_pool_tokens), whole pages, plus the padding page
        ps, ratio = self.page_size, self.host_pool_tokens / self.full_pool_tokens
        host = (int(self.full_pool_tokens * ratio) // ps + 1) * ps if self.host_pool_tokens else 0
        swa_host = (int(self.swa_tokens * ratio) // ps + 1) * ps if host and self.has_swa else None
        if self.kv_stack == "dsv4" and self.host_pool_tokens:
            host, swa_host = self.dsv4_host_pool_tokens()
        return MemoryConfig(
            page_size=self.page_size, full_pool_tokens=self.full_pool_tokens,
            sliding_window_tokens=self.sliding_window_tokens, swa_pool_tokens=self.swa_tokens,
            host_pool_tokens=0 if eic else host, swa_host_pool_tokens=None if eic else swa_host,
            cache_kind="eic" if eic else "radix",
            device_free=self.device_free, host_free=self.host_free, swa_lru_refresh=self.swa_lru_refresh,
            eviction_policy=self.eviction_policy, hicache_write_policy=self.hicache_write_policy,
            swa_release_boundary=self.swa_release_boundary,
            swa_out_of_window_release=self.swa_out_of_window_release,
            hicache_write_ack="next_step")  # acknowledged at the next step, as sglang's Scheduler

    def dsv4_host_pool_tokens(self) -> tuple[int, int]:
        """(host_full, host_swa) of DeepSeek-V4's HiCache stack (``LogicalHostPool`` anchor, the SWA
        ``DeepSeekV4PagedHostPool``): each ``max(int(device pages * ratio), device pages + 1)``
        pages, at the ratio that gives ``host_pool_tokens`` (and ``host_swa_pool_tokens`` when set)
        as the fork sizes them (:mod:`replay.backends.dsv4`)."""
        from replay.backends.dsv4 import hicache_ratio_for, host_pool_tokens

        ratio = hicache_ratio_for(self.full_pool_tokens, self.swa_tokens, self.host_pool_tokens,
                                  self.host_swa_pool_tokens, page_size=self.page_size, swa_page_size=self.page_size)
        return host_pool_tokens(self.full_pool_tokens, self.swa_tokens, ratio, page_size=self.page_size,
                                swa_page_size=self.page_size)

    def server(self) -> dict:
        """Manifest ``server`` block (``tracer.schema.SERVER_KEYS``)."""
        eic = self.prefix_ownership == "eic_release_protected_prefix"
        return self.server_block(cache_kind="eic" if eic else "unified_radix", model="kvtrace-reference-backend",
                                 sglang_version="")


#: Settings from resolved knob values (:func:`replay.knobs.resolve`).
from_knobs = ReferenceSettings.from_knobs

__all__ = ["ReferenceSettings", "from_knobs"]
