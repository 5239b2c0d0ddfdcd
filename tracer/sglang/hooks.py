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

from tracer.sglang import admission, allocators, host_pool, radix, req_pool, requests, state, stats
from tracer.sglang.patching import Patcher

log = logging.getLogger("kvtrace.sglang")

SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)

_patcher = Patcher()
_lock = threading.RLock()
_MODULES = (allocators, req_pool, host_pool, radix, admission, requests, stats)


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


def install(*, check: bool = True, lazy: bool = False) -> int:
    """Wrap the real sglang methods (idempotent). Returns how many methods were wrapped now.

    Args:
        check: refuse sglang versions other than ``SUPPORTED_SGLANG_VERSIONS``.
        lazy: wrap only the sglang modules already imported (the autoload calls this after
            each watched module loads); default imports them.
    Raises:
        UnsupportedSglang: another sglang version (with ``check``).
        ImportError: sglang (or a module it needs) is not importable.
    Mutates: sglang classes and modules (reversibly, see ``uninstall``).
    """
    with _lock:
        if check:
            check_version()
        n = 0
        for m in _MODULES:
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
        return n


def is_installed() -> bool:
    return len(_patcher) > 0


def patched() -> list[tuple[object, str, object]]:
    """(owner, name, original) of every current patch (for tests and ``kvtrace hooks status``)."""
    return _patcher.originals()


def patch_count() -> int:
    return len(_patcher)
