"""Hooks for the DeepSeek-V4 fork of sglang (bytedance-iaas/sglang ``bytedance/deepseek_v4``, the
commits before and at #659): the rows of the 0.5.23 hooks, with the same meaning, on the fork's
module layout and API. One module per fork module hooked (``sglang.srt.…``):

==========================  ===================================================================
hook module                 fork module: classes / functions
==========================  ===================================================================
``allocator``               ``mem_cache.allocator``: ``TokenToKVPoolAllocator``,
                            ``PagedTokenToKVPoolAllocator`` (leaves: every pool row)
``swa_memory_pool``         ``mem_cache.swa_memory_pool.SWATokenToKVPoolAllocator`` (tags,
                            free-group markers)
``memory_pool``             ``mem_cache.memory_pool.ReqToTokenPool`` (0.5.23's hooks)
``memory_pool_host``        ``mem_cache.memory_pool_host``: ``HostKVCache`` (and
                            ``DeepSeekV4PagedHostPool``), ``LogicalHostPool``, ``HostPoolGroup``
``unified_radix_cache``     ``mem_cache.unified_radix_cache.UnifiedRadixCache`` (lock rows:
                            ``unified_radix_cache_locks``)
``common``                  ``mem_cache.common``: ``release_kv_cache``,
                            ``free_swa_out_of_window_slots`` (#659)
``schedule_policy``         ``managers.schedule_policy.PrefillAdder``
``schedule_batch``          ``managers.schedule_batch``: ``Req``, ``ScheduleBatch``
``scheduler``               ``managers.scheduler.Scheduler``, ``…pool_stats_observer``; the
                            fork's ``held`` tokens
==========================  ===================================================================

``dsv4`` (not a hook) writes the DSV4 layout into the rank entry. Each module has ``CONTRACTS``
and ``install(patcher, lazy, level) -> int``; :func:`install` runs them all (docs/capture.md,
"The DeepSeek-V4 fork").
"""

from __future__ import annotations

from tracer.sglang.hooks.fork import (allocator, common, memory_pool, memory_pool_host,
                                      schedule_batch, schedule_policy, scheduler,
                                      swa_memory_pool, unified_radix_cache)

MODULES = (allocator, swa_memory_pool, memory_pool, memory_pool_host, unified_radix_cache, common,
           schedule_policy, schedule_batch, scheduler)
CONTRACTS = tuple(c for m in MODULES for c in m.CONTRACTS)


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Install every fork hook module (as ``tracer.sglang.hooks.install`` does for 0.5.23)."""
    n = 0
    for m in MODULES:
        try:
            n += m.install(patcher, lazy=lazy, level=level)
        except AttributeError:
            if not lazy:
                raise
    return n
