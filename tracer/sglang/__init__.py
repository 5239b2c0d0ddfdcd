"""kvtrace hooks for a live SGLang 0.5.23 server (or any process driving its real classes).

Usage in-process::

    import tracer, tracer.sglang
    tracer.sglang.install()                 # wrap the real sglang methods (idempotent)
    tracer.start("/traces/run1", source="sglang-hooks")
    ...                                     # sglang code runs; pool/cache/sched/stats rows flow
    tracer.sglang.step(mode, batch_size, num_tokens)   # once per step if not the real Scheduler
    tracer.stop(); tracer.sglang.uninstall()   # uninstall restores the exact originals

Without code changes: ``KVTRACE_DIR=/traces/run1`` plus the ``.pth`` autoload
(``kvtrace hooks install-pth`` or ``kvtrace launch``) makes every Python process that imports
sglang install the hooks and, once it builds real pools, record its own rank. See
docs/capture.md.

This package imports sglang only inside ``install()``.
"""

from tracer.sglang.hooks import (  # noqa: F401
    SUPPORTED_SGLANG_VERSIONS,
    UnsupportedSglang,
    check_version,
    install,
    installed_level,
    is_installed,
    patch_count,
    patched,
    uninstall,
)
from tracer.sglang.state import failures  # noqa: F401


def autoload_boot_names() -> frozenset:
    """Module names the autoload watcher (``autoload_boot.py``) waits for."""
    from pathlib import Path

    ns: dict = {"__name__": "kvtrace_autoload_boot_names"}
    src = Path(__file__).with_name("autoload_boot.py").read_text()
    exec(compile(src.split("def _kvtrace_arm")[0], "autoload_boot.py", "exec"), ns)
    return ns["WATCHED"]
from tracer.sglang.stats import configure, sample, step  # noqa: F401

__all__ = ["install", "uninstall", "is_installed", "installed_level", "step", "sample", "configure", "failures",
           "check_version",
           "SUPPORTED_SGLANG_VERSIONS", "UnsupportedSglang"]
