"""``install()`` / ``uninstall()`` of every sglang hook (idempotent; exact restore).

The hook families live in small modules:

- ``allocators``: device allocators (token, paged, SWA composite);
- ``req_pool``: ``ReqToTokenPool`` (request rows; which requests hold KV);
- ``host_pool``: HiCache host pools and host pool groups;
- ``radix``: ``UnifiedRadixCache`` and the ``common.py`` request helpers;
- ``admission``: ``PrefillAdder`` admission, prefill budgets, retraction;
- ``requests``: ``Req`` arrival (finish is emitted by ``radix``'s ``release_kv_cache`` hook);
- ``stats``: per-step ``sched``/``stats`` rows (``step()``), the real ``Scheduler`` loop hook.

``install()`` may be called again after more sglang modules were imported (the autoload does
so): it wraps what is new and leaves what is already wrapped alone.
"""

from __future__ import annotations

import logging
import threading

from tracer.sglang import (admission, allocators, host_pool, level_steps, radix, req_pool, requests,
                           state, stats)
from tracer.sglang.patching import Patcher

log = logging.getLogger("kvtrace.sglang")

SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)

_patcher = Patcher()
_lock = threading.RLock()
_MODULES = (allocators, req_pool, host_pool, radix, admission, requests, stats)
# Level ``steps``: arrivals, the step boundary, and what the stats sampler and finish rows need.
_STEPS_MODULES = (requests, stats, level_steps)


def modules_for(detail: str) -> tuple:
    """The hook modules a capture level installs (``pages`` hooks as ``counts``)."""
    return _STEPS_MODULES if detail == "steps" else _MODULES


class UnsupportedSglang(RuntimeError):
    """The installed sglang is not a version these hooks were written and tested against."""


def sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def check_version() -> str:
    """Return the installed sglang version; raise ``UnsupportedSglang`` for other versions."""
    v = sglang_version()
    if v not in SUPPORTED_SGLANG_VERSIONS:
        raise UnsupportedSglang(
            f"kvtrace sglang hooks support sglang {', '.join(SUPPORTED_SGLANG_VERSIONS)}; "
            f"installed: {v}")
    return v


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
        level = (state.installed_level if detail is None and len(_patcher) else
                 state.resolve_detail(detail))
        if (level == "steps") != (state.installed_level == "steps") and len(_patcher):
            _patcher.restore()  # another hook set: re-wrap from the originals
        state.installed_level = level
        n = 0
        for m in modules_for(level):
            try:
                n += m.install(_patcher, lazy=lazy)
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
        state.installed_level = "counts"
        return n


def sync_detail(detail: str) -> None:
    """Re-install the hooks for ``detail`` when the installed set is another level's (a recording
    started at a level the hooks were not installed for)."""
    if len(_patcher) and (detail == "steps") != (state.installed_level == "steps"):
        install(check=False, lazy=True, detail=detail)
    elif len(_patcher):
        state.installed_level = detail


def installed_level() -> str:
    """The capture level of the installed hooks."""
    return state.installed_level


def is_installed() -> bool:
    return len(_patcher) > 0


def patched() -> list[tuple[object, str, object]]:
    """(owner, name, original) of every current patch (for tests and ``kvtrace hooks status``)."""
    return _patcher.originals()


def patch_count() -> int:
    return len(_patcher)
