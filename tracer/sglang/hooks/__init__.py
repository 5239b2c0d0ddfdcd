"""``install()`` / ``uninstall()`` of every sglang hook (idempotent; exact restore).

One module per sglang module, named after it, holds the hooks of the classes sglang defines
there (docs/capture.md has the class -> module map):

=============================  ===============================================================
hook module                    sglang classes / functions (``sglang.srt...``)
=============================  ===============================================================
``allocator``                  ``mem_cache.allocator``: ``TokenToKVPoolAllocator``,
                               ``PagedTokenToKVPoolAllocator`` (leaves); helpers in
                               ``allocator_common``; ``allocator_swa``:
                               ``SWATokenToKVPoolAllocator``; ``allocator_decode``: the decode
                               allocation, measured around ``prepare_for_decode``
``memory_pool``                ``mem_cache.memory_pool.ReqToTokenPool``
``pool_host``                  ``mem_cache.pool_host``: ``HostKVCache``, ``HostPoolGroup``;
                               ``mem_cache.memory_pool_host.LogicalHostPool``
``unified_radix_cache``        ``mem_cache.unified_radix_cache.UnifiedRadixCache`` (lock rows:
                               ``unified_radix_cache_locks``)
``mem_cache_common``           ``mem_cache.common``: ``release_kv_cache``,
                               ``free_swa_out_of_window_slots``
``schedule_policy``            ``managers.schedule_policy.PrefillAdder``,
                               ``mem_cache.prefill_budget.PrefillBudget``
``schedule_batch``             ``managers.schedule_batch``: ``Req``, ``ScheduleBatch``,
                               ``release_req``
``scheduler``                  ``managers.scheduler.Scheduler``,
                               ``managers.scheduler_components...SchedulerPoolStatsObserver``
=============================  ===============================================================

Each module has ``install(patcher, lazy, level)``; at level ``steps`` most install nothing or
a lighter variant (docs/capture.md). ``install()`` may be called again after more sglang modules
were imported (the autoload does so): it wraps what is new and leaves what is wrapped alone.
"""

from __future__ import annotations

import logging
import threading

from tracer.sglang.hooks import (allocator, mem_cache_common, memory_pool, pool_host,
                                 schedule_batch, schedule_policy, scheduler, unified_radix_cache)
from tracer.sglang.patching import Patcher
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import S
from tracer.sglang.versions import (  # noqa: F401  (re-exported)
    SUPPORTED_SGLANG_VERSIONS,
    UnsupportedSglang,
    check_version,
    sglang_version,
)

log = logging.getLogger("kvtrace.sglang")

_patcher = Patcher()
_lock = threading.RLock()
MODULES = (allocator, memory_pool, pool_host, unified_radix_cache, mem_cache_common,
           schedule_policy, schedule_batch, scheduler)


def install(*, check: bool = True, lazy: bool = False, detail: str | None = None) -> int:
    """Wrap the real sglang methods (idempotent). Returns how many methods were wrapped now.

    Args:
        check: refuse sglang versions other than ``SUPPORTED_SGLANG_VERSIONS``.
        lazy: wrap only the sglang modules already imported (the autoload calls this after
            each watched module loads); default imports them.
        detail: capture level (``steps``, ``counts``, ``pages``); None: the level already
            installed, else ``KVTRACE_DETAIL``, else ``counts``. ``steps`` wraps only arrivals,
            finishes, the step boundary and what the stats sampler reads (docs/capture.md);
            another level than the installed one re-installs (the registry is kept).
    Raises:
        ValueError: an unknown ``detail``.
        UnsupportedSglang: another sglang version (with ``check``).
        ImportError: sglang (or a module it needs) is not importable.
    Mutates: sglang classes and modules (reversibly, see ``uninstall``).
    """
    with _lock:
        if check:
            check_version()
        level = S.level if detail is None and len(_patcher) else state.resolve_detail(detail)
        if (level == "steps") != (S.level == "steps") and len(_patcher):
            _patcher.restore()  # another hook set: re-wrap from the originals
        S.level = level
        n = 0
        for m in MODULES:
            try:
                n += m.install(_patcher, lazy=lazy, level=level)
            except AttributeError:
                if not lazy:
                    raise
                # a module still being imported (circular import): wrapped on a later call
        return n


def uninstall() -> int:
    """Restore every original method and function (exact objects). Returns how many.

    Idempotent. Does not stop a running recording.
    """
    with _lock:
        n = _patcher.restore()
        state.registry.clear()
        S.level = "counts"
        return n


def sync_detail(detail: str) -> None:
    """Re-install the hooks for ``detail`` when the installed set is another level's (a recording
    started at a level the hooks were not installed for)."""
    if len(_patcher) and (detail == "steps") != (S.level == "steps"):
        install(check=False, lazy=True, detail=detail)
    elif len(_patcher):
        S.level = detail


def _on_new_recording(rec) -> None:
    detail = getattr(getattr(rec, "opts", None), "detail", None)
    if detail is not None and detail != S.level:
        sync_detail(detail)


S.new_recording_listeners.append(_on_new_recording)


def installed_level() -> str:
    """The capture level of the installed hooks."""
    return S.level


def is_installed() -> bool:
    return len(_patcher) > 0


def patched() -> list[tuple[object, str, object]]:
    """(owner, name, original) of every current patch (for tests and ``kvtrace hooks status``)."""
    return _patcher.originals()


def patch_count() -> int:
    return len(_patcher)
