"""Activation without code changes: ``KVTRACE_DIR`` + a ``.pth`` file (or ``kvtrace launch``).

How it works:

1. ``kvtrace_autoload.pth`` (in site-packages; ``kvtrace hooks install-pth``, written by
   ``launch.py``) runs at interpreter
   start-up. Only when ``KVTRACE_DIR`` is set, it executes ``autoload_boot.py`` (stdlib only),
   which puts a watcher on ``sys.meta_path``. Without ``KVTRACE_DIR`` it costs one environment
   lookup. ``kvtrace launch`` does the same through a ``sitecustomize`` shim on ``PYTHONPATH``,
   so it works without installing anything.
2. When a watched sglang module (allocators, host pools, radix cache, scheduler...) has finished
   loading, :func:`on_module_loaded` installs the hooks for what is loaded so far
   (``install(lazy=True)``; repeated as more modules load).
3. The first real pool, tree or scheduler built in the process starts the recorder into
   ``KVTRACE_DIR`` (so the tokenizer/detokenizer processes, which build none, write nothing).
   Each process records its own rank partition: ``dp_rank * tp_size * pp_size + pp_rank *
   tp_size + tp_rank`` from sglang's parallel context when known and free, else the lowest free
   rank.

Coverage: the code is recognized as a target (``tracer.sglang.targets``) at the first watched
module. Code that is no known target, or whose hooks do not cover it fully when the recording
would start, records nothing: one line on stderr, the process noted in the manifest's
``uncovered`` list, and the trace's state is ``uncovered``. ``KVTRACE_PARTIAL=1`` records what the
matching hooks cover instead (state ``partial``). Each rank file holds the ``coverage``.

Environment: ``KVTRACE_DIR`` (trace directory; required), ``KVTRACE_DETAIL`` (``steps`` |
``counts`` | ``pages``), ``KVTRACE_FLUSH_MS`` (default 1000), ``KVTRACE_HASH_BLOCK_TOKENS`` (default 16),
``KVTRACE_IDLE_SAMPLE_MS`` (default 1000), ``KVTRACE_AUTOLOAD=0`` (disarm without unsetting
``KVTRACE_DIR``), ``KVTRACE_PARTIAL=1`` (record partial coverage).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

import tracer
from tracer.sglang import hooks
from tracer.sglang.activation import parent_watch, serverinfo
from tracer.sglang.activation.launch import (  # noqa: F401  (re-exported: kvtrace hooks/launch)
    BOOT_FILE,
    PTH_NAME,
    install_pth,
    pth_line,
    pth_status,
    site_packages,
    uninstall_pth,
    write_launch_shim,
)
from tracer.sglang import targets
from tracer.sglang.runtime import requests, state
from tracer.sglang.runtime.state import S

log = logging.getLogger("kvtrace.sglang")

_lock = threading.RLock()
_status = {"disabled": None, "installed": 0, "manifest_updated": False}


def enabled() -> bool:
    return bool(os.environ.get("KVTRACE_DIR")) and os.environ.get("KVTRACE_AUTOLOAD", "1") != "0"


def on_module_loaded(name: str) -> None:
    """Watcher callback: install the hooks for the sglang modules loaded so far.

    Never raises (errors are logged once); code that is no known target (without
    ``KVTRACE_PARTIAL``) or a bad ``KVTRACE_DETAIL`` disarms the autoload, said on stderr.
    """
    if not enabled() or _status["disabled"]:
        return
    with _lock:
        try:
            partial = hooks.partial_requested()
            if _status["installed"] == 0:
                state.resolve_detail(None)  # a wrong KVTRACE_DETAIL disarms, named in the log
                det = targets.detect()
                if det.target is None and not partial:
                    _refuse(det.reason, det.as_dict())
                    return
            _status["installed"] += hooks.install(check=False, lazy=True, partial=partial)
            cov = hooks.coverage()
            if not partial and cov is not None and cov["state"] == "none" \
                    and cov.get("target") is not None and not any(
                        h["state"] == "unused" for h in cov["hooks"].values()):
                _refuse(f"{cov['target']}: no hook of this target is installed yet", cov)
                return
            S.starter = start_recording
        except ValueError as e:
            _status["disabled"] = str(e)
            log.error("kvtrace: %s; hooks not installed", e)
        except Exception as e:
            state.note_failure("autoload.install", e)


def _refuse(reason: str, info: dict) -> None:
    """Record nothing in this process: one line on stderr, an ``uncovered`` manifest entry, the
    hooks removed, the autoload disarmed."""
    _status["disabled"] = reason
    sys.stderr.write(f"kvtrace: NOT RECORDING (pid {os.getpid()}): {reason}. The trace "
                     f"{os.environ.get('KVTRACE_DIR')} is `uncovered`; `kvtrace hooks check` "
                     "shows each hook; `kvtrace launch --partial` (KVTRACE_PARTIAL=1) records "
                     "what the matching hooks cover.\n")
    sys.stderr.flush()
    try:
        hooks.uninstall()
    except Exception as e:
        state.note_failure("autoload.uninstall", e)
    from tracer.schema import manifest

    entry = {k: info.get(k) for k in ("target", "sglang_version", "sglang_root", "fingerprint",
                                      "fingerprint_known", "state", "level")}
    entry.update(pid=os.getpid(), argv=list(sys.argv[:4]), reason=reason,
                 hooks={n: h.get("state") for n, h in (info.get("hooks") or {}).items()})
    try:
        d = os.environ["KVTRACE_DIR"]
        manifest.create_or_join(d, manifest.new_manifest(source="sglang-hooks"))
        manifest.note_uncovered(d, entry)
    except Exception as e:
        log.error("kvtrace: could not note the uncovered process in the manifest: %s", e)


def _rank_guess():
    """This process's rank from sglang's parallel context, or None (auto) when unknown/taken."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        tp, tp_size = int(p.tp_rank), int(p.tp_size)
        pp, pp_size = int(getattr(p, "pp_rank", 0) or 0), int(getattr(p, "pp_size", 1) or 1)
        dp = getattr(p, "dp_rank", None)
        rank = (int(dp) if dp is not None else 0) * tp_size * pp_size + pp * tp_size + tp
    except Exception:
        return None
    path = Path(os.environ["KVTRACE_DIR"]) / "ranks" / f"rank={rank}.json"
    try:  # reserve it exclusively: two processes of the same tp rank (e.g. DP replicas) race
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:
        return None
    return rank


def start_recording(reason: str) -> None:
    """Start the recorder in this process (called on the first real sglang object)."""
    if tracer.is_active() or not enabled() or _status["disabled"]:
        return
    with _lock:
        if tracer.is_active() or _status["disabled"]:
            return
        partial = hooks.partial_requested()
        try:  # wrap what an import cycle left for later, then judge the coverage
            _status["installed"] += hooks.install(check=False, lazy=True, partial=partial)
        except Exception as e:
            state.note_failure("autoload.install", e)
        cov = hooks.coverage()
        if cov is not None and cov["state"] != "full" and not partial:
            bad = [f"{n} {h['state']}" for n, h in cov["hooks"].items()
                   if h["state"] in ("absent", "mismatch")]
            _refuse(f"{cov.get('target') or 'no known target'}: coverage {cov['state']} "
                    f"({', '.join(bad[:4])}{'...' if len(bad) > 4 else ''})", cov)
            return
        # The drain process serializes out of the server's interpreter (no GIL handoff to a
        # flusher thread while the scheduler steps; docs/tracer.md "Drain"); KVTRACE_FLUSHER=thread
        # keeps everything in process.
        opts = {"flush_interval_ms": int(os.environ.get("KVTRACE_FLUSH_MS", "1000")),
                "detail": state.resolve_detail(None),  # KVTRACE_DETAIL, default counts
                "flusher": _flusher()}
        tracer.start(os.environ["KVTRACE_DIR"], rank=_rank_guess(), source="sglang-hooks",
                     server=serverinfo.from_live(),
                     hash_block_tokens=int(os.environ.get("KVTRACE_HASH_BLOCK_TOKENS",
                                                          requests.DEFAULT_HASH_BLOCK_TOKENS)),
                     **opts)
        update_manifest_server()  # what is known now (the first pool); again at the first step
        S.on_step = update_manifest_server
        parent_watch.arm()  # sglang SIGKILLs this process when its parent exits: close first
        log.info("kvtrace: recording %s (pid %d, first object: %s)", os.environ["KVTRACE_DIR"],
                 os.getpid(), reason)


def _flusher() -> str:
    """``KVTRACE_FLUSHER`` (``process``, the default for live capture, or ``thread``)."""
    value = os.environ.get("KVTRACE_FLUSHER", "process").strip().lower() or "process"
    if value not in ("process", "thread"):
        log.error("kvtrace: KVTRACE_FLUSHER=%r is not 'process' or 'thread'; using 'process'", value)
        return "process"
    return value


def update_manifest_server() -> None:
    """Merge the live server description (pool sizes...) into the trace manifest."""
    rec = tracer.active()
    if rec is None:
        return
    live = serverinfo.from_live()
    if not live:
        return
    from tracer.schema import manifest

    def merge(m: dict) -> None:
        srv = m.setdefault("server", {}) or {}
        srv.update({k: v for k, v in live.items() if v is not None})
        m["server"] = srv

    manifest.update_manifest(rec.dir, merge)


__all__ = ["enabled", "on_module_loaded", "start_recording", "update_manifest_server",
           # re-exported from launch.py (``kvtrace hooks``/``kvtrace launch`` and tests use them through this module)
           "BOOT_FILE", "PTH_NAME", "install_pth", "pth_line", "pth_status", "site_packages", "uninstall_pth",
           "write_launch_shim"]
