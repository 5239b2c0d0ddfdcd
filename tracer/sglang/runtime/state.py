"""Process-wide state shared by the sglang hooks: one object, :data:`S`, plus the helpers that
read it. Nothing here imports sglang or torch, nor any other ``tracer.sglang`` module.

Contents:
    S: the :class:`HookState` (installed level, current request, dirty flag, step counter,
        admission pin depths, the recording snapshot, activation callbacks).
    recording(): True while the tracer records (one identity test, no call into the recorder).
    sync_recording() / recorder(): the snapshot of the recording the emits belong to, refreshed
        when ``tracer.pool`` is rebound (a new recording, a stop); listeners run on a new one.
    rid_of(req) / rid_for(str) / session_for(id): sglang's string ids mapped to small ints.
    rid_context: ``with rid_context(rid):`` attributes the ops inside to ``rid``.
    registry: weak references to the live tree cache, top-level allocator, host pools and the
        requests holding KV rows, read by the per-step ``stats`` sampler.
    failures / note_failure: hook errors swallowed so that sglang never sees them.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import Counter

import tracer

log = logging.getLogger("kvtrace.sglang")

# The no-op bound to ``tracer.pool`` while not recording: ``tracer.pool is NOOP`` is the
# cheapest "not recording" test (one module attribute read and an identity comparison).
NOOP = tracer.DISABLED["pool"]
_NOOP = NOOP  # (the name the hook modules use)

LEVELS = ("steps", "counts", "pages")


class HookState:
    """Everything the hooks share in this process (the one instance is :data:`S`).

    Attributes:
        level: capture level of the installed hooks (``steps``/``counts``/``pages``).
        cur_rid: the request on whose behalf allocator/cache ops currently run (-1: none or
            shared). One slot per process: the scheduler is single-threaded; a host-pool op from
            another thread may read a stale value, which only affects attribution.
        dirty: set by every row that can change a pool, the tree's ledger or a request's KV;
            the stats sampler samples only when set (or when the interval is negative).
        pin_select / pin_commit: depth inside ``PrefillAdder.add_one_req``/``add_chunked_req``
            and inside its commit: the selection's temporary prefix pin leaves no rows.
        swa_release_depth: depth inside a recorded out-of-window SWA release (the fork's
            ``_evict_swa`` calls the common helper at #659: the outermost writes the row).
        forward_ct: the step counter of ``sched``/``stats`` rows.
        emit_key: the ``tracer.pool`` the recording snapshot was taken for.
        rec: the active recorder (``tracer.active()``) of that snapshot, or None.
        pages: that recording captures page ids (``detail="pages"``).
        starter: set by the autoload when ``KVTRACE_DIR`` arms it: starts recording on the first
            real pool, tree or scheduler (``touch``).
        on_step: called once at the next step boundary, then cleared (the autoload merges the
            live server description into the manifest).
        server_args: ``ServerArgs`` of the scheduler built in this process (manifest, rank).
    """

    __slots__ = ("level", "cur_rid", "dirty", "pin_select", "pin_commit", "swa_release_depth", "forward_ct",
                 "emit_key", "rec", "pages", "starter", "on_step", "server_args",
                 "new_recording_listeners")

    def __init__(self):
        self.level = "counts"
        self.cur_rid = -1
        self.dirty = True
        self.pin_select = self.pin_commit = 0
        self.swa_release_depth = 0
        self.forward_ct = 0
        self.emit_key = None
        self.rec = None
        self.pages = False
        self.starter = None
        self.on_step = None
        self.server_args = None
        self.new_recording_listeners: list = []


S = HookState()


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
    return tracer.pool is not NOOP


def sync_recording() -> None:
    """Refresh ``S.rec``/``S.pages`` for the recording ``tracer.pool`` belongs to; on a new
    recording, run the ``new_recording_listeners`` with it. Hot paths call this only when
    ``tracer.pool is not S.emit_key`` (each recording binds its own emit functions)."""
    key = tracer.pool
    if key is S.emit_key:
        return
    rec = tracer.active()
    S.emit_key = key
    new = rec is not None and rec is not S.rec
    S.rec = rec
    S.pages = rec is not None and getattr(rec.opts, "detail", None) == "pages"
    if new:
        for fn in list(S.new_recording_listeners):
            try:
                fn(rec)
            except Exception as e:
                note_failure("state.new_recording", e)


def recorder():
    """The active recorder the hooks write to (None when not recording)."""
    if tracer.pool is not S.emit_key:
        sync_recording()
    return S.rec


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


# --------------------------------------------------------------------------------------------
# Request and session ids
# --------------------------------------------------------------------------------------------
class _Ids:
    """sglang's string request/session ids -> small ints, numbered from 0 per trace."""

    __slots__ = ("rids", "sessions", "next_rid", "next_session", "lock")

    def __init__(self):
        self.rids: dict = {}
        self.sessions: dict = {}
        self.next_rid = self.next_session = 0
        self.lock = threading.Lock()


_ids = _Ids()
_rids = _ids.rids


def rid_for(rid_str) -> int:
    """Small int for a server request id (assigned on first sight, stable until ``forget``)."""
    if rid_str is None:
        return -1
    try:
        r = _rids.get(rid_str)
    except TypeError:  # an unhashable id: never raise into sglang
        return -1
    if r is None:
        with _ids.lock:
            r = _rids.get(rid_str)
            if r is None:
                r = _rids[rid_str] = _ids.next_rid
                _ids.next_rid += 1
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
    s = _ids.sessions.get(session_id)
    if s is None:
        with _ids.lock:
            s = _ids.sessions.setdefault(session_id, _ids.next_session)
            if s == _ids.next_session:
                _ids.next_session += 1
    return s


class rid_context:
    """``with rid_context(rid):`` attributes the allocator/cache ops inside to ``rid``."""

    __slots__ = ("rid", "prev")

    def __init__(self, rid: int):
        self.rid = rid

    def __enter__(self):
        self.prev = S.cur_rid
        S.cur_rid = self.rid
        return self

    def __exit__(self, *exc):
        S.cur_rid = self.prev
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


def new_trace() -> None:
    """Per-trace numbering restarts: request and session ids and the step counter from 0."""
    with _ids.lock:
        _rids.clear()
        _ids.sessions.clear()
        _ids.next_rid = _ids.next_session = 0
    S.forward_ct = 0


def reset() -> None:
    """Forget ids, registry and counters (tests; ``uninstall``)."""
    new_trace()
    S.cur_rid = -1
    registry.clear()
    failures.clear()


# --------------------------------------------------------------------------------------------
# Lazy start (autoload): the first real pool/tree/scheduler object starts the recorder
# --------------------------------------------------------------------------------------------
def touch(reason: str) -> None:
    """Called when a real sglang pool, tree or scheduler is built; starts recording if armed.

    Args:
        reason: what was built ("allocator", "tree", "host_pool", "scheduler").
    """
    s = S.starter
    if s is not None and tracer.pool is NOOP:
        try:
            s(reason)
        except Exception as e:
            note_failure("autoload.start", e)
    if tracer.pool is not NOOP and tracer.pool is not S.emit_key:
        sync_recording()  # per-recording set-up now, while the server builds, not in a step
