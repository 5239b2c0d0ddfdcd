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

Layout (a hook is found by the sglang module that defines the class it wraps):

- ``hooks/``: ``install``/``uninstall`` and one module per sglang module (``hooks/__init__.py``
  and docs/capture.md map each sglang class to its hook module);
- ``runtime/``: the one state object and ids, ``request`` rows, the step/``stats`` sampler;
- ``activation/``: the ``KVTRACE_DIR`` autoload, the ``.pth``/launch shim, server info;
- ``patching.py`` (reversible patches), ``wrappers.py`` (the repeated wrapper shapes),
  ``versions.py`` (the code check, declared once); ``targets/``: the code bases captured,
  recognized by their code, the hooks' contracts and the coverage recorded per rank.

This package imports sglang only inside ``install()``.
"""

from tracer.sglang.hooks import (  # noqa: F401
    install,
    installed_level,
    is_installed,
    patch_count,
    patched,
    uninstall,
)
from tracer.sglang.runtime import requests, state  # noqa: F401  (tracer.sglang.state.rid_of, ...)
from tracer.sglang.runtime.sampler import configure, sample, step  # noqa: F401
from tracer.sglang.runtime.state import failures  # noqa: F401
from tracer.sglang.versions import SUPPORTED_SGLANG_VERSIONS, UnsupportedSglang, check_version  # noqa: F401


def autoload_boot_names() -> frozenset:
    """Module names the autoload watcher (``activation/autoload_boot.py``) waits for."""
    from pathlib import Path

    ns: dict = {"__name__": "kvtrace_autoload_boot_names"}
    src = (Path(__file__).parent / "activation" / "autoload_boot.py").read_text()
    exec(compile(src.split("def _kvtrace_arm")[0], "autoload_boot.py", "exec"), ns)
    return ns["WATCHED"]


__all__ = ["install", "uninstall", "is_installed", "installed_level", "step", "sample", "configure",
           "failures", "check_version", "SUPPORTED_SGLANG_VERSIONS", "UnsupportedSglang",
           # re-exported for callers and tests (tracer.sglang.patched(), tracer.sglang.state.rid_of, ...)
           "patch_count", "patched", "requests", "state"]
