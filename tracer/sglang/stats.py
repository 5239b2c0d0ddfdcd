"""Per-step ``sched`` (kind ``step``) and ``stats`` rows.

A step ends at a *boundary*: the top of the real ``Scheduler.get_next_batch_to_run`` (once the
previous iteration's results are processed), or, for loops that are not the real scheduler (the
real-code backend), ``SchedulerPoolStatsObserver.get_pool_stats`` (the scheduler's per-step pool
sample). The step's batch (mode, size, tokens) is noted by the ``ScheduleBatch.prepare_for_extend``
/ ``prepare_for_decode`` hooks. At a boundary the hooks write the step row, one ``stats`` row per
pool, then refresh the tracer's step clock. A custom loop may call ``step(...)`` itself.

``stats`` columns, per pool, all read from the live objects (CPU counters only):

=========  =====================================================================================
pool       capacity / available / evictable / protected / held
=========  =====================================================================================
full       allocator size / full available / tree full evictable / tree full protected /
           request-private: sum over requests holding a KV row of ``kv_private_tokens``
           (sglang's own helper: page-ceiled allocated length minus the protected prefix), plus
           session-held rows
swa        the same for the SWA pool (``kv_private_swa_tokens``: minus the freed out-of-window
           range) plus ``tree.swa_transient_size()``
host_*     host pool size / available (free + released) / used (host copies owned by the tree,
           reclaimable by host eviction) / 0 / 0
=========  =====================================================================================

So ``available + evictable + protected + held == capacity`` is sglang's own leak invariant
(``scheduler_components/invariant_checker.py``), evaluated on every step instead of only in
debug mode; a broken identity in the trace is a leak in the server.

Requests holding KV rows are known from ``ReqToTokenPool.alloc``/``free`` (weak references).
Idle iterations are sampled at most once per ``KVTRACE_IDLE_SAMPLE_MS`` (default 1000 ms).
"""

from __future__ import annotations

import os
from time import perf_counter_ns

import tracer
from tracer.schema import Mode, Pool, SchedKind
from tracer.sglang import state
from tracer.sglang.patching import exact_only

_NOOP = state._NOOP
STEP = int(SchedKind.STEP)
FULL, SWA, HOST_FULL, HOST_SWA = int(Pool.FULL), int(Pool.SWA), int(Pool.HOST_FULL), int(Pool.HOST_SWA)
IDLE, PREFILL, DECODE, MIXED = int(Mode.IDLE), int(Mode.PREFILL), int(Mode.DECODE), int(Mode.MIXED)

_helpers: dict = {}
_last_sample = [0]  # perf_counter_ns of the last stats sample


def _env_ms(name: str, default: float) -> int:
    try:
        return int(float(os.environ.get(name, default)) * 1e6)
    except ValueError:
        return int(default * 1e6)


# Sampling cadence (``configure``; env defaults): stats rows are written at a step boundary when
# something changed since the last sample (a pool, the tree's ledger, a request's KV) and at least
# ``stats_interval_ms`` passed (0: at every such step; < 0: at every step, changed or not). Idle
# steps write their step row at most once per ``idle_sample_ms``.
_cfg = {"interval_ns": _env_ms("KVTRACE_STATS_INTERVAL_MS", 10.0),
        "idle_ns": _env_ms("KVTRACE_IDLE_SAMPLE_MS", 1000.0)}


def configure(*, stats_interval_ms: float | None = None, idle_sample_ms: float | None = None) -> dict:
    """Set the sampling cadence; returns the settings in force (ms).

    Args:
        stats_interval_ms: minimum wall time between ``stats`` samples (default 10, env
            ``KVTRACE_STATS_INTERVAL_MS``); 0 samples at every step where something changed,
            a negative value at every step.
        idle_sample_ms: minimum wall time between two idle ``step`` rows (default 1000).
    """
    if stats_interval_ms is not None:
        _cfg["interval_ns"] = int(stats_interval_ms * 1e6)
    if idle_sample_ms is not None:
        _cfg["idle_ns"] = int(idle_sample_ms * 1e6)
    return {"stats_interval_ms": _cfg["interval_ns"] / 1e6, "idle_sample_ms": _cfg["idle_ns"] / 1e6}


def held_tokens(tree, ps: int, swa: bool) -> tuple[int, int]:
    """(full, swa) request-private tokens: KV rows of live requests and sessions.

    Per row, the full side is the page-ceiled allocated length minus the protected prefix
    (sglang's ``kv_private_tokens``, inlined: it runs for every request at every sample); the
    SWA side additionally subtracts the freed out-of-window range, via sglang's own
    ``kv_private_swa_tokens`` for the rows that have freed any.
    """
    kvs = []
    if tree is not None:
        try:
            recs = tree.session_records()
            if recs:
                kvs = [kv for kv in recs.values() if kv.req_pool_idx is not None]
        except Exception:
            pass
    session_ids = {id(kv) for kv in kvs}
    for r in list(state.registry.live_reqs.values()):
        kv = r.kv
        if kv.req_pool_idx is not None and id(kv) not in session_ids:
            kvs.append(kv)
    full = swa_held = 0
    swa_ct = _helpers.get("swa_ct")
    swa_fn = _helpers.get("swa")
    for kv in kvs:
        own = -(-kv.kv_allocated_len // ps) * ps - kv.cache_protected_len
        full += own
        if swa:
            if swa_fn is not None and kv.component_evicted_seqlens.get(swa_ct):
                swa_held += swa_fn(kv, ps)
            else:
                swa_held += own
    if swa and tree is not None:
        swa_held += int(tree.swa_transient_size())
    return full, swa_held


def sample(forward_ct: int | None = None) -> int:
    """Emit one ``stats`` row per known pool. Returns the number of rows (0 when not recording).

    Args:
        forward_ct: step number for the rows (default: the current step clock).
    """
    if tracer.pool is _NOOP:
        return 0
    try:
        return _sample(state.step_clock.forward_ct if forward_ct is None else forward_ct)
    except Exception as e:
        state.note_failure("stats.sample", e)
        return 0


# (full evictable, full protected) of the tree at the last sample: an idle step samples again when
# they changed outside the hooked methods (HiCache write-through acks unlock nodes at idle).
_last_tree: list = [None]


def _tree_sizes():
    tree = state.registry.tree
    try:
        return None if tree is None else (int(tree.full_evictable_size()),
                                          int(tree.full_protected_size()))
    except Exception:
        return None


def _sample(fct: int) -> int:
    tree = state.registry.tree
    alloc = state.registry.allocator
    if alloc is None and tree is not None:
        alloc = tree.token_to_kv_pool_allocator
    rows = 0
    if alloc is not None:
        is_swa = hasattr(alloc, "swa_available_size") and hasattr(alloc, "size_swa")
        ps = alloc.page_size
        tree_swa = tree is not None and getattr(tree, "is_swa_enabled", False)
        full_held, swa_held = held_tokens(tree, ps, is_swa)
        if is_swa:
            full_cap, full_av = int(alloc.size_full), int(alloc.full_available_size())
        else:
            full_cap, full_av = int(alloc.size), int(alloc.available_size())
        ev = int(tree.full_evictable_size()) if tree is not None else 0
        pr = int(tree.full_protected_size()) if tree is not None else 0
        _last_tree[0] = (ev, pr)
        tracer.stats(fct, FULL, full_cap, full_av, ev, pr, full_held)
        rows += 1
        if is_swa and not getattr(alloc, "_swa_req_ring", False):
            ev = int(tree.swa_evictable_size()) if tree_swa else 0
            pr = int(tree.swa_protected_size()) if tree_swa else 0
            tracer.stats(fct, SWA, int(alloc.size_swa), int(alloc.swa_available_size()), ev, pr,
                         swa_held)
            rows += 1
    for hp in list(state.registry.host_pools.values()):
        pool = hp.__dict__.get("_kvt_pool", HOST_FULL)
        if pool is None:
            continue
        cap = int(getattr(hp, "logical_size", hp.size))
        av = int(hp.available_size())
        tracer.stats(fct, pool, cap, av, cap - av, 0, 0)
        rows += 1
    return rows


def _mode_of(batch) -> int:
    if batch is None:
        return IDLE
    fm = getattr(batch, "forward_mode", None)
    if fm is None:
        return IDLE
    if fm.is_idle():
        return IDLE
    if fm.is_mixed():
        return MIXED
    if fm.is_decode():
        return DECODE
    if fm.is_extend():
        return PREFILL
    return IDLE


def step(mode: int, batch_size: int = 0, num_tokens: int = 0, step_ns: int = 0,
         forward_ct: int | None = None, stats: bool = True) -> None:
    """Record one scheduling step: a ``sched`` step row, ``stats`` rows, then ``tracer.tick()``.

    Call it once per step, after the step's results are processed (pools consistent).

    Args:
        mode: ``tracer.schema.Mode`` code of the step's batch.
        batch_size: requests in the batch.
        num_tokens: tokens run (extend tokens for prefill, batch size for decode).
        step_ns: wall time of the step.
        forward_ct: step number (default: previous + 1).
        stats: also sample the pools (when anything changed since the last sample, or at every
            step with ``KVTRACE_STATS=step``).
    Mutates: ``state.step_clock.forward_ct``.
    """
    if tracer.pool is _NOOP:
        return
    try:
        fct = state.step_clock.forward_ct + 1 if forward_ct is None else int(forward_ct)
        state.step_clock.forward_ct = fct
        tracer.sched(STEP, fct, int(mode), int(batch_size), int(num_tokens), int(step_ns))
        if stats and (state.dirty[0] or _cfg["interval_ns"] < 0):
            now = perf_counter_ns()
            if _cfg["interval_ns"] <= 0 or now - _last_sample[0] >= _cfg["interval_ns"]:
                _last_sample[0] = now
                state.dirty[0] = False
                _sample(fct)
        # (the sched row above already refreshed the step clock, like tracer.tick())
    except Exception as e:
        state.note_failure("stats.step", e)
    if state.manifest_pending[0]:
        try:
            from tracer.sglang import autoload

            autoload.update_manifest_server()
        except Exception as e:
            state.note_failure("stats.manifest", e)


# ------------------------------------------------------------------ loop hooks
class _LoopState:
    """The step in progress: batch prepared since the last boundary, start time."""

    def __init__(self):
        self.t0 = 0  # perf_counter_ns at the previous boundary (0: none yet)
        self.mode = IDLE
        self.batch_size = 0
        self.num_tokens = 0
        self.last_idle_emit = 0
        self.scheduler_driven = False  # a real Scheduler loop drives the boundaries
        self.observer = 0  # id() of the stats observer last adopted (slots: no weakref)
        self.rec = None  # the recording this state belongs to (reset for a new one)

    def fresh(self) -> None:
        """Forget the previous recording's loop state when a new recording started (and bring
        the installed hooks to its capture level if they were installed for another)."""
        if self.rec is not tracer._active:
            self.__init__()
            rec = self.rec = tracer._active
            detail = getattr(getattr(rec, "opts", None), "detail", None)
            if detail is not None and detail != state.installed_level:
                from tracer.sglang import hooks

                hooks.sync_detail(detail)

    def note_batch(self, mode: int, batch_size: int, num_tokens: int) -> None:
        self.fresh()
        if self.t0 == 0:
            self.t0 = perf_counter_ns()
        if self.mode == PREFILL and mode == DECODE or self.mode == MIXED:
            self.mode = MIXED
            self.batch_size = max(self.batch_size, batch_size)
            self.num_tokens += num_tokens
        else:
            self.mode, self.batch_size, self.num_tokens = mode, batch_size, num_tokens


_loop = _LoopState()
_registry = state.registry


def boundary(forward_ct: int | None = None) -> None:
    """End the step in progress: its ``step`` row (batch noted by the ``prepare_for_*`` hooks,
    wall time since the previous boundary) and the ``stats`` rows. Idle steps are sampled at
    most once per ``KVTRACE_IDLE_SAMPLE_MS``. (``step()`` inlined: this runs every step.)"""
    lp = _loop
    if lp.rec is not tracer._active:
        lp.fresh()
    now = perf_counter_ns()
    mode = lp.mode
    if mode == IDLE:
        if not lp.t0 or (lp.last_idle_emit and now - lp.last_idle_emit < _cfg["idle_ns"]):
            lp.t0 = now  # the first boundary (no step before it), or idle spinning
            return
        lp.last_idle_emit = now
        if not state.dirty[0] and _last_tree[0] is not None and _tree_sizes() != _last_tree[0]:
            state.dirty[0] = True
    else:
        lp.last_idle_emit = 0
    clock = state.step_clock
    fct = clock.forward_ct + 1 if forward_ct is None else forward_ct
    clock.forward_ct = fct
    tracer.sched(STEP, fct, mode, lp.batch_size, lp.num_tokens, now - lp.t0 if lp.t0 else 0)
    lp.t0 = now
    lp.mode, lp.batch_size, lp.num_tokens = IDLE, 0, 0
    interval = _cfg["interval_ns"]
    if (state.dirty[0] and (interval <= 0 or now - _last_sample[0] >= interval)) or interval < 0:
        _last_sample[0] = now
        state.dirty[0] = False
        _sample(fct)
    if state.manifest_pending[0]:
        from tracer.sglang import autoload

        autoload.update_manifest_server()


def _adopt(tree, alloc) -> None:
    """Make the loop's own tree/allocator the ones sampled (they may predate ``install``)."""
    reg = state.registry
    if tree is not None and reg.tree is not tree and hasattr(tree, "full_evictable_size"):
        reg.tree = tree
    if alloc is not None and reg.allocator is not alloc:
        reg.allocator = alloc
        from tracer.sglang.allocators import tag_swa

        tag_swa(alloc)


def _make_prepare(mode: int):
    """``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode`` (no arguments in 0.5.23):
    note the step's batch; the decode one also measures the decode allocation
    (``allocators.measure_decode``)."""
    from tracer.sglang.allocators import measure_decode

    decode = mode == DECODE
    steps = state.installed_level == "steps"  # no pool rows: sample stats after every batch
    dirty = state.dirty

    def make(orig):
        def prepare(self):
            if tracer.pool is _NOOP:
                return orig(self)
            if steps:
                out = orig(self)
                dirty[0] = True
            else:
                out = measure_decode(self, orig) if decode else orig(self)
            try:
                lp = _loop
                if lp.rec is not tracer._active:
                    lp.fresh()
                bs = len(self.reqs)
                if not decode:
                    lp.note_batch(mode, bs, int(self.extend_num_tokens or 0))
                elif lp.mode == IDLE and lp.t0:  # the common decode step
                    lp.mode, lp.batch_size, lp.num_tokens = mode, bs, bs
                else:
                    lp.note_batch(mode, bs, bs)
            except Exception as e:
                state.note_failure("stats.prepare", e)
            return out

        return prepare

    return make


def _make_get_pool_stats():
    """Step boundary of loops that are not the real ``Scheduler`` (the real-code backend calls
    ``get_pool_stats`` once per step, after processing the step's results)."""

    def make(orig):
        def get_pool_stats(self):
            lp = _loop
            if tracer.pool is not _NOOP and not lp.scheduler_driven:
                try:
                    if lp.rec is not tracer._active:
                        lp.fresh()
                    ref = _registry._tree  # (the registry's weak reference, read without a call)
                    if id(self) != lp.observer or ref is None or ref() is None:
                        lp.observer = id(self)
                        _adopt(self.tree_cache, self.token_to_kv_pool_allocator)
                    boundary()
                except Exception as e:
                    state.note_failure("stats.get_pool_stats", e)
            return orig(self)

        return get_pool_stats

    return make


def _make_get_next_batch():
    """Step boundary of the real ``Scheduler``: the top of each loop iteration."""

    def make(orig):
        def get_next_batch_to_run(self, *args, **kwargs):
            if tracer.pool is not _NOOP:
                try:
                    _loop.fresh()
                    _loop.scheduler_driven = True
                    _adopt(getattr(self, "tree_cache", None),
                           getattr(self, "token_to_kv_pool_allocator", None))
                    boundary(int(getattr(self, "forward_ct", 0)))
                except Exception as e:
                    state.note_failure("stats.loop", e)
            return orig(self, *args, **kwargs)

        return get_next_batch_to_run

    return make


def _make_scheduler_init():
    def make(orig):
        def init(self, *args, **kwargs):
            try:
                state.registry.scheduler = self
                state.server_args_hint[0] = args[0] if args else kwargs.get("server_args")
                state.touch("scheduler")
            except Exception as e:
                state.note_failure("stats.scheduler_init", e)
            return orig(self, *args, **kwargs)

        return init

    return make


def install(patcher, lazy: bool = False) -> int:
    """Take sglang's request-private-token helpers; hook the step boundaries.

    The scheduler module is never imported here (it pulls the whole serving stack); the
    autoload wraps ``Scheduler`` when the server imports it, and ``install()`` does if loaded.
    """
    from tracer.sglang.patching import target

    n = 0
    pso = target("sglang.srt.managers.scheduler_components.pool_stats_observer", lazy)
    if pso is not None:
        _helpers["swa"] = pso.kv_private_swa_tokens
        _helpers["swa_ct"] = pso.ComponentType.SWA
        n += patcher.wrap_method(pso.SchedulerPoolStatsObserver, "get_pool_stats",
                                 exact_only("(self)", _make_get_pool_stats()))
    sb = target("sglang.srt.managers.schedule_batch", lazy)
    if sb is not None:
        n += patcher.wrap_method(sb.ScheduleBatch, "prepare_for_extend",
                                 exact_only("(self)", _make_prepare(PREFILL)))
        n += patcher.wrap_method(sb.ScheduleBatch, "prepare_for_decode",
                                 exact_only("(self)", _make_prepare(DECODE)))
    sched_mod = target("sglang.srt.managers.scheduler", True)
    if sched_mod is not None and hasattr(sched_mod, "Scheduler"):
        S = sched_mod.Scheduler
        n += patcher.wrap_method(S, "get_next_batch_to_run", _make_get_next_batch())
        n += patcher.wrap_method(S, "__init__", _make_scheduler_init())
    return n
