"""Process-wide state shared by the sglang hooks: recording flag, request ids, context, registry.

Everything here is cheap to read on the hot path. Nothing here imports sglang or torch.

Contents:
    recording(): True while the tracer records (one identity test, no call into the recorder).
    rid_of(req) / rid_for(str): sglang's string request ids mapped to small ints (a dict).
    cur_rid: the request on whose behalf the current allocator/cache op runs (-1: none/shared).
    registry: weak references to the live tree cache, top-level allocator, host pools and
        requests holding KV rows, used by the per-step ``stats`` sampler.
    failures: hook errors swallowed so that sglang never sees them (counted, logged once each).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import Counter
from time import perf_counter_ns

import tracer

log = logging.getLogger("kvtrace.sglang")

# The no-op bound to ``tracer.pool`` while not recording: ``tracer.pool is _NOOP`` is the
# cheapest "not recording" test (one module attribute read and an identity comparison).
_NOOP = tracer.DISABLED["pool"]


# --------------------------------------------------------------------------------------------
# Capture level (``detail``): which hooks are installed
# --------------------------------------------------------------------------------------------
LEVELS = ("steps", "counts", "pages")
installed_level = "counts"  # level of the installed hooks (``hooks.install``); pages: as counts


def resolve_detail(detail: str | None) -> str:
    """The capture level: ``detail`` if given, else ``KVTRACE_DETAIL``, else ``counts``.

    Raises:
        ValueError: not one of ``LEVELS`` (names the setting and the accepted values).
    """
    src = "detail"
    if detail is None:
        detail, src = os.environ.get("KVTRACE_DETAIL", "") or "counts", "KVTRACE_DETAIL"
    if detail not in LEVELS:
        raise ValueError(f"{src}={detail!r}: expected one of {', '.join(LEVELS)}")
    return detail


def recording() -> bool:
    """True while ``tracer`` records in this process (emit functions are bound)."""
    return tracer.pool is not _NOOP


# --------------------------------------------------------------------------------------------
# Hook failures: counted, logged once per site, never raised into sglang
# --------------------------------------------------------------------------------------------
failures: Counter = Counter()


def note_failure(site: str, exc: BaseException) -> None:
    """Count a swallowed hook error; log the first one of each site.

    Args:
        site: short name of the hook (e.g. ``"allocator.alloc"``).
        exc: the exception caught.
    Mutates: ``failures``.
    """
    try:
        failures[site] += 1
        if failures[site] == 1:
            log.warning("kvtrace hook %s failed (further errors counted silently): %r", site, exc)
    except Exception:  # pragma: no cover - logging must never raise either
        pass


def run_measured(obj, orig, args, kwargs, account, site: str):
    """Run ``orig(obj, *args, **kwargs)`` once under the re-entrancy flag (nested wrapped calls
    are then not counted again), then ``account(dur_ns, out)``; an error there is counted under
    ``site``, never raised. Returns what ``orig`` returned (its exceptions propagate)."""
    d = obj.__dict__
    d["_kvt_busy"] = True
    out = None
    t0 = perf_counter_ns()
    try:
        out = orig(obj, *args, **kwargs)
        return out
    finally:
        dur = perf_counter_ns() - t0
        d["_kvt_busy"] = False
        try:
            account(dur, out)
        except Exception as e:
            note_failure(site, e)


# --------------------------------------------------------------------------------------------
# Request ids
# --------------------------------------------------------------------------------------------
_rids: dict[str, int] = {}
_sessions: dict[str, int] = {}
_next_rid = [0]
_next_session = [0]
_rid_lock = threading.Lock()


def rid_for(rid_str) -> int:
    """Small int for a server request id (assigned on first sight, stable until ``forget``)."""
    if rid_str is None:
        return -1
    try:
        r = _rids.get(rid_str)
    except TypeError:  # an unhashable id: never raise into sglang
        return -1
    if r is None:
        with _rid_lock:
            r = _rids.get(rid_str)
            if r is None:
                r = _rids[rid_str] = _next_rid[0]
                _next_rid[0] += 1
    return r


def rid_of(req) -> int:
    """Int request id of an sglang ``Req`` (or -1 for None / an object without ``rid``).
    The common case, an id already seen, is one dict lookup (hot path: match, admission)."""
    try:
        r = _rids.get(req.rid)
    except Exception:  # None, no ``rid``, an unhashable id
        r = None
    if r is not None:
        return r
    if req is None:
        return -1
    return rid_for(getattr(req, "rid", None))


def forget_rid(rid_str) -> None:
    """Drop a finished request's id mapping (keeps the dict bounded on long runs)."""
    _rids.pop(rid_str, None)


def session_for(session_id) -> int:
    """Int id of a session/conversation id (-1 when None)."""
    if session_id is None:
        return -1
    s = _sessions.get(session_id)
    if s is None:
        with _rid_lock:
            s = _sessions.setdefault(session_id, _next_session[0])
            if s == _next_session[0]:
                _next_session[0] += 1
    return s


# The request on whose behalf allocator/cache ops currently run. One slot per process: the
# scheduler is single-threaded; a host-pool op from another thread may read a stale value,
# which only affects attribution (rid is informational, never used for accounting).
cur_rid = [-1]


class rid_context:
    """``with rid_context(rid):`` attributes the allocator/cache ops inside to ``rid``."""

    __slots__ = ("rid", "prev")

    def __init__(self, rid: int):
        self.rid = rid

    def __enter__(self):
        self.prev = cur_rid[0]
        cur_rid[0] = self.rid
        return self

    def __exit__(self, *exc):
        cur_rid[0] = self.prev
        return False


# --------------------------------------------------------------------------------------------
# Registry of live objects (weak), for stats sampling
# --------------------------------------------------------------------------------------------
class Registry:
    """Weak references to what the stats sampler reads. Never keeps sglang objects alive."""

    def __init__(self):
        self._tree = None
        self._allocator = None
        self.host_pools: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
        # id(req) -> Req holding a request row (strong: the row holds it alive anyway; removed
        # by ReqToTokenPool.free/clear)
        self.live_reqs: dict[int, object] = {}
        self.scheduler = None

    @property
    def tree(self):
        return self._tree() if self._tree is not None else None

    @tree.setter
    def tree(self, obj):
        self._tree = weakref.ref(obj) if obj is not None else None

    @property
    def allocator(self):
        return self._allocator() if self._allocator is not None else None

    @allocator.setter
    def allocator(self, obj):
        self._allocator = weakref.ref(obj) if obj is not None else None

    def clear(self) -> None:
        self._tree = self._allocator = None
        self.host_pools.clear()
        self.live_reqs.clear()
        self.scheduler = None


registry = Registry()


class StepClock:
    """Forward counter and step bookkeeping shared by the step sampler and sched rows."""

    def __init__(self):
        self.forward_ct = 0


step_clock = StepClock()


def env_flag(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def new_trace() -> None:
    """Per-trace numbering restarts: request and session ids and the step counter from 0."""
    with _rid_lock:
        _rids.clear()
        _sessions.clear()
        _next_rid[0] = 0
        _next_session[0] = 0
    step_clock.forward_ct = 0


def reset() -> None:
    """Forget ids, registry and counters (tests; ``uninstall``)."""
    new_trace()
    cur_rid[0] = -1
    registry.clear()
    failures.clear()


# --------------------------------------------------------------------------------------------
# Lazy start (autoload): the first real pool/tree/scheduler object starts the recorder
# --------------------------------------------------------------------------------------------
starter: list = [None]  # set by tracer.sglang.autoload when KVTRACE_DIR arms it


def touch(reason: str) -> None:
    """Called when a real sglang pool, tree or scheduler is built; starts recording if armed.

    Args:
        reason: what was built ("allocator", "tree", "host_pool", "scheduler").
    """
    s = starter[0]
    if s is not None and tracer.pool is _NOOP:
        try:
            s(reason)
        except Exception as e:
            note_failure("autoload.start", e)

# ServerArgs of the scheduler being built in this process (set by the Scheduler hook), for the
# manifest and the rank of a lazily started recording.
server_args_hint: list = [None]

# Set when the autoload started the recorder: the live server description (pool sizes) is
# merged into the manifest at the first step.
manifest_pending: list = [False]

# Set by every row that can change a pool, the tree's ledger or a request's private KV; the
# stats sampler samples only when it is set (or on ``KVTRACE_STATS=step``), then clears it.
dirty = [True]
# [depth inside PrefillAdder.add_one_req/add_chunked_req, depth inside its commit]: the
# selection's temporary prefix pin (lock + unlock of the candidate's prefix) leaves no rows.
admission_pin = [0, 0]
