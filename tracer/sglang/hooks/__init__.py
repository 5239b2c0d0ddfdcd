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

Each module has ``CONTRACTS`` (what it needs of the code, ``tracer.sglang.targets.Contract``)
and ``install(patcher, lazy, level)``; at level ``steps`` most install nothing or a lighter
variant (docs/capture.md). Which modules install is the detected target's ``hook_modules``
(``tracer.sglang.targets``); ``coverage()`` is every hook's state. ``install()`` may be called again after more sglang modules
were imported (the autoload does so): it wraps what is new and leaves what is wrapped alone.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading

from tracer.sglang import targets
from tracer.sglang.hooks import (allocator, mem_cache_common, memory_pool, pool_host,
                                 schedule_batch, schedule_policy, scheduler, unified_radix_cache)
from tracer.sglang.patching import Patcher
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import S
from tracer.sglang.versions import (  # noqa: F401  (re-exported)
    SUPPORTED_SGLANG_VERSIONS,
    UnsupportedSglang,
    check_target,
    check_version,
    sglang_version,
)

log = logging.getLogger("kvtrace.sglang")

_patcher = Patcher()
_lock = threading.RLock()
# The hook modules of upstream sglang 0.5.23 (the target ``sglang-0.5.23``; also what
# ``partial`` installs on code that is no known target).
MODULES = (allocator, memory_pool, pool_host, unified_radix_cache, mem_cache_common,
           schedule_policy, schedule_batch, scheduler)
_cov: dict = {"detection": None, "partial": False, "modules": (), "coverage": None}


def partial_requested() -> bool:
    """``KVTRACE_PARTIAL`` is set (not empty, not ``0``): record what matches on code that is
    no known target or not fully covered (``kvtrace launch --partial``)."""
    return os.environ.get("KVTRACE_PARTIAL", "").strip() not in ("", "0")


def _hook_modules(detection, partial: bool) -> tuple:
    if detection.target is not None:
        names = detection.target.hook_modules
    elif partial:
        names = targets.SGLANG_0_5_23.hook_modules
    else:
        names = ()
    return tuple(importlib.import_module(n) for n in names)


def _refused(module, level: str) -> str | None:
    """Why ``module`` must not install: one of its required contracts mismatches (its hooks would
    read what this code does not have), else None."""
    for c in getattr(module, "CONTRACTS", ()):
        if not c.optional:
            ch = targets.check(c, level, None)
            if ch.state == targets.MISMATCH:
                return ch.reason
    return None


def install(*, check: bool = True, lazy: bool = False, detail: str | None = None,
            partial: bool | None = None) -> int:
    """Wrap the real sglang methods (idempotent). Returns how many methods were wrapped now.

    Args:
        check: refuse code that is no known target (``tracer.sglang.targets.detect``); without
            it (or with ``partial``) such code gets the 0.5.23 hook modules whose contracts match.
        lazy: wrap only the sglang modules already imported (the autoload calls this after
            each watched module loads); default imports them.
        detail: capture level (``steps``, ``counts``, ``pages``); None: the level already
            installed, else ``KVTRACE_DETAIL``, else ``counts``. ``steps`` wraps only arrivals,
            finishes, the step boundary and what the stats sampler reads (docs/capture.md);
            another level than the installed one re-installs (the registry is kept).
        partial: record what matches on unknown code (default ``KVTRACE_PARTIAL``).
    Raises:
        ValueError: an unknown ``detail``.
        UnsupportedSglang: no known target (with ``check``, without ``partial``).
        ImportError: sglang (or a module it needs) is not importable.
    Mutates: sglang classes and modules (reversibly, see ``uninstall``); the coverage
        (``coverage()``) and the active recording's rank info.
    """
    with _lock:
        det = targets.detect()
        partial = partial_requested() if partial is None else partial
        if check and det.target is None and not partial:
            check_target()  # raises, naming why
        level = S.level if detail is None and len(_patcher) else state.resolve_detail(detail)
        if (level == "steps") != (S.level == "steps") and len(_patcher):
            _patcher.restore()  # another hook set: re-wrap from the originals
        S.level = level
        modules = _hook_modules(det, partial or not check)
        n = 0
        refused = {}
        for m in modules:
            try:
                why = _refused(m, level)
                if why is not None:
                    refused[m.__name__] = why
                    continue
                n += m.install(_patcher, lazy=lazy, level=level)
            except AttributeError:
                if not lazy:
                    raise
                # a module still being imported (circular import): wrapped on a later call
        _cov.update(detection=det, partial=bool(partial), modules=modules)
        _update_coverage(level)
        for name, why in refused.items():
            if name not in _refused_logged:
                _refused_logged.add(name)
                log.warning("kvtrace: %s not installed: %s", name, why)
        return n


_refused_logged: set = set()


def _update_coverage(level: str) -> dict | None:
    det = _cov["detection"]
    if det is None:
        return None
    cov = targets.coverage(det, targets.contracts_of(_cov["modules"]), level,
                           _patcher.is_patched, partial=_cov["partial"])
    _cov["coverage"] = cov
    import tracer

    rec = tracer.active()
    if rec is not None and getattr(rec, "pid", None) == os.getpid() and rec.info.get("coverage") != cov:
        rec.info["coverage"] = cov
        rec.info_changed = True  # rewritten into the rank file at the next flush
    return cov


def coverage() -> dict | None:
    """The coverage of the installed hooks (``tracer.sglang.targets.coverage``; recomputed now),
    None before the first ``install``."""
    with _lock:
        return _update_coverage(S.level) if _cov["detection"] is not None else None


def _rank_info() -> dict:
    """Rank-file keys of a recording started while hooks are installed (``coverage``)."""
    cov = coverage() if len(_patcher) or _cov["detection"] is not None else None
    return {"coverage": cov} if cov is not None else {}


def uninstall() -> int:
    """Restore every original method and function (exact objects). Returns how many.

    Idempotent. Does not stop a running recording.
    """
    with _lock:
        n = _patcher.restore()
        state.registry.clear()
        S.level = "counts"
        _cov.update(detection=None, partial=False, modules=(), coverage=None)
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


def _register_rank_info() -> None:
    from tracer import recorder

    providers = getattr(recorder, "RANK_INFO_PROVIDERS", None)
    if providers is not None and _rank_info not in providers:
        providers.append(_rank_info)


_register_rank_info()


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


def coverage_here(level: str = "counts") -> dict:
    """What the hooks would cover in this environment, without a server (``kvtrace hooks
    check``): detect the target, import the modules its contracts name, install (lazily, with
    ``partial`` so unknown code is tried too), take the coverage, uninstall. A module that cannot
    be imported here leaves its hooks ``unused``, listed in ``import_errors``.

    Returns: the coverage object (``tracer.sglang.targets.coverage``) plus ``import_errors``
        ({module: error}). Raises: ValueError: an unknown level.
    Mutates: nothing that stays (the hooks are uninstalled again; sglang modules stay imported).
    """
    state.resolve_detail(level)
    det = targets.detect()
    errors: dict[str, str] = {}
    if det.root is None:
        cov = targets.coverage(det, [], level, None)
        cov["import_errors"] = errors
        return cov
    mods = _hook_modules(det, True)
    for name in sorted({c.module for c in targets.contracts_of(mods)}):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (a broken import is the answer, not a crash)
            errors[name] = f"{type(e).__name__}: {e}"[:200]
    was = len(_patcher) > 0
    try:
        install(check=False, lazy=True, detail=level, partial=det.target is None)
        cov = dict(coverage() or {})
    finally:
        if not was:
            uninstall()
    cov["import_errors"] = errors
    return cov


__all__ = ["MODULES", "coverage", "coverage_here", "install", "installed_level", "is_installed", "partial_requested",
           "patch_count", "patched", "sync_detail", "uninstall",
           # re-exported from tracer.sglang.versions (callers use them through this module)
           "SUPPORTED_SGLANG_VERSIONS", "UnsupportedSglang", "check_target", "check_version", "sglang_version"]
