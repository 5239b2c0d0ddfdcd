"""kvtrace tracer: records allocator, cache and scheduler events inside a server process.

Owns the trace schema (``tracer.schema``), the recorder and the on-disk segments. Imports only
the standard library, numpy and pyarrow; never imports ``replay``, torch, duckdb, polars or plotly.

Usage::

    import tracer
    tracer.start("/data/traces/run1", server={"page_size": 64, ...})
    tracer.tick()                                   # once per scheduling step
    tracer.pool(Pool.FULL, PoolOp.ALLOC, rid, 128, 2)
    tracer.stop()

Emit functions are module attributes rebound at ``start``/``stop``: always call them through the
module (``tracer.pool(...)``), never ``from tracer import pool``. When not recording they are
no-ops. They never raise into the caller and never block on I/O; a full buffer drops events and
the loss is recorded in the ``drops`` family.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from tracer.emitgen import EMIT_NAMES, make_noops
from tracer.recorder import Recorder, RecorderOptions
from tracer.schema import (  # noqa: F401  (re-exported enums)
    SCHEMA_VERSION,
    CacheOp,
    DropReason,
    Mode,
    Pool,
    PoolOp,
    RequestEvent,
    SchedKind,
    Verdict,
)

__all__ = ["start", "stop", "route", "is_active", "active", "tick", "set_clock", "flush", *EMIT_NAMES, "RecorderOptions",
           # re-exported from tracer.schema
           "SCHEMA_VERSION", "CacheOp", "DropReason", "Mode", "Pool", "PoolOp", "RequestEvent", "SchedKind",
           "Verdict"]

log = logging.getLogger("kvtrace.tracer")
_lock = threading.Lock()
_active: Recorder | None = None

_NOOPS = make_noops()
# The disabled emits: ``tracer.pool is tracer.DISABLED["pool"]`` is the cheapest "not recording"
# test for hooks on hot paths (an identity check, no call).
DISABLED = _NOOPS
# Emit functions (rebound by _bind). Signatures: see tracer.recorder._EMITS.
pool, pool_ids, cache, sched, stats, request = (_NOOPS[n] for n in EMIT_NAMES)


def tick() -> int:
    """Refresh the step clock used by ``pool``/``cache`` rows; returns ts_ns (0 when off)."""
    return 0


def set_clock(ts_ns: int) -> int:
    """Set the trace clock (recorders started with ``clock="manual"``); returns ts_ns."""
    return 0


def _bind(emits: dict | None) -> None:
    g = globals()
    for name in EMIT_NAMES:
        g[name] = emits[name] if emits else _NOOPS[name]
    g["tick"] = emits["tick"] if emits else _tick_off
    g["set_clock"] = emits["set_clock"] if emits else _set_clock_off


_tick_off, _set_clock_off = tick, set_clock


def start(out_dir: str | os.PathLike, *, rank: int | None = None, source: str = "tracer",
          server: dict | None = None, hash_block_tokens: int | None = None, env: dict | None = None,
          **options) -> Recorder:
    """Start recording into ``out_dir`` (rank partition ``rank``, or the lowest free one).

    Args:
        out_dir: trace directory; joined when it already holds a manifest.
        rank: partition; None claims the lowest free one.
        source: manifest producer source ('tracer', 'sglang-hooks', ...).
        server: server config for the manifest (tracer.schema.SERVER_KEYS).
        hash_block_tokens: tokens per page hash in ``request.page_hashes``.
        env: environment flags for the manifest (default: every SGLANG_* variable).
        **options: RecorderOptions fields (flush_interval_ms, buffer_events, detail, clock, ...).

    Raises:
        RuntimeError: already recording in this process.
        ValueError: bad option.
    """
    global _active
    opts = RecorderOptions(**options)
    fields = {"server": dict(server or {}), "hash_block_tokens": hash_block_tokens}
    if env is not None:
        fields["env"] = dict(env)
    with _lock:
        if _active is not None and not _active.stopped:
            raise RuntimeError(f"kvtrace is already recording to {_active.dir}")
        rec = Recorder(out_dir, rank=rank, options=opts, manifest_fields=fields, source=source,
                       on_disable=lambda emits=None: _bind(emits))
        _active = rec
        _bind(rec.emits)
        if sys.excepthook is not _note_exit_exception:
            _prev_excepthook[0] = sys.excepthook
            sys.excepthook = _note_exit_exception
    return rec


def route(emits: dict | None) -> None:
    """Send the emit functions to ``emits`` instead of a recorder, or back to the no-ops (None).

    For an in-process consumer that aggregates the events instead of recording them (kvtrace's
    figures-only replays, ``replay.runs.figures``). ``emits`` maps every name of ``EMIT_NAMES``
    plus ``tick`` and ``set_clock`` to a function with that emit's signature; the functions run
    on the caller's hot paths, so they must be cheap and must not raise.

    Raises:
        RuntimeError: while recording (a recorder owns the emits), or a name missing from ``emits``.
    """
    with _lock:
        if active() is not None:
            raise RuntimeError(f"kvtrace is recording to {_active.dir}; stop it before routing its emits")
        if emits is not None:
            missing = [n for n in (*EMIT_NAMES, "tick", "set_clock") if n not in emits]
            if missing:
                raise RuntimeError(f"tracer.route: no function for {', '.join(missing)}")
        _bind(emits)


def stop(end_state: str = "complete") -> None:
    """Stop recording: flush, close and convert segments, and record how the recording ended
    (``end_state``: "complete", "interrupted" or "crashed") in the rank file. Safe to call when
    not recording."""
    global _active
    with _lock:
        rec, _active = _active, None
    if rec is not None and rec.pid == os.getpid():
        rec.stop(end_state)


# The interpreter is exiting with an uncaught exception: the rank ends "interrupted"
# (KeyboardInterrupt) or "crashed" (anything else) rather than "complete".
_exit_exception: list = [None]
_prev_excepthook: list = [sys.excepthook]


def _note_exit_exception(exc_type, exc, tb) -> None:
    _exit_exception[0] = exc_type
    _prev_excepthook[0](exc_type, exc, tb)


def _stop_at_exit() -> None:
    exc = _exit_exception[0]
    if exc is None:
        stop("complete")
    else:
        stop("interrupted" if issubclass(exc, KeyboardInterrupt) else "crashed")


def flush() -> None:
    """Write everything buffered now (normally the flusher thread does this)."""
    rec = _active
    if rec is not None:
        rec.request_flush()


def active() -> Recorder | None:
    """The recorder of this process's recording, or None (not recording, stopped or failed).

    Hooks use this (never the private ``_active``); on hot paths they test ``tracer.pool``
    identity instead, which changes whenever a recording starts, stops or fails."""
    return _active if _active is not None and not _active.stopped and not _active.failed else None


def is_active() -> bool:
    return active() is not None


def _after_fork_in_child() -> None:
    global _active, _lock
    _lock = threading.Lock()
    rec, _active = _active, None
    _bind(None)
    if rec is None or rec.stopped:
        return
    rec.abandon_in_child()
    if rec.opts.on_fork == "child":
        try:
            start(rec.dir, source=rec.manifest["producer"].get("source", "tracer"),
                  **{k: getattr(rec.opts, k) for k in rec.opts.__dataclass_fields__})
        except Exception as e:  # never break the child
            log.error("kvtrace: could not start recording in forked child: %s", e)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_stop_at_exit)
