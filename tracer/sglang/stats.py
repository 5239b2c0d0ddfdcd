"""Per-step ``sched`` (kind ``step``) and ``stats`` rows.

``step(...)`` is the one call a scheduling loop makes per step (the real ``Scheduler`` is hooked
to make it itself, at the top of each ``get_next_batch_to_run``, i.e. once the previous iteration's
results are processed). It writes the step row, then one ``stats`` row per pool, then refreshes the
tracer's step clock.

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

_NOOP = state._NOOP
STEP = int(SchedKind.STEP)
FULL, SWA, HOST_FULL, HOST_SWA = int(Pool.FULL), int(Pool.SWA), int(Pool.HOST_FULL), int(Pool.HOST_SWA)
IDLE, PREFILL, DECODE, MIXED = int(Mode.IDLE), int(Mode.PREFILL), int(Mode.DECODE), int(Mode.MIXED)

_helpers: dict = {}


def _private_tokens(kv, ps: int) -> int:
    f = _helpers.get("full")
    if f is not None:
        return f(kv, ps)
    return -(-kv.kv_allocated_len // ps) * ps - kv.cache_protected_len


def _private_swa_tokens(kv, ps: int) -> int:
    f = _helpers.get("swa")
    if f is not None:
        return f(kv, ps)
    return _private_tokens(kv, ps)


def held_tokens(tree, ps: int, swa: bool) -> tuple[int, int]:
    """(full, swa) request-private tokens: KV rows of live requests and sessions."""
    session_kvs = {}
    if tree is not None:
        try:
            session_kvs = {id(kv): kv for kv in tree.session_records().values() if kv.holds_kv}
        except Exception:
            session_kvs = {}
    kvs = list(session_kvs.values())
    for r in list(state.registry.live_reqs.values()):
        kv = getattr(r, "kv", None)
        if kv is not None and kv.holds_kv and id(kv) not in session_kvs:
            kvs.append(kv)
    full = sum(_private_tokens(kv, ps) for kv in kvs)
    swa_held = 0
    if swa:
        swa_held = sum(_private_swa_tokens(kv, ps) for kv in kvs)
        if tree is not None:
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
        stats: also sample the pools.
    Mutates: ``state.step_clock.forward_ct``.
    """
    if tracer.pool is _NOOP:
        return
    try:
        fct = state.step_clock.forward_ct + 1 if forward_ct is None else int(forward_ct)
        state.step_clock.forward_ct = fct
        tracer.sched(STEP, fct, int(mode), int(batch_size), int(num_tokens), int(step_ns))
        if stats:
            _sample(fct)
        tracer.tick()
    except Exception as e:
        state.note_failure("stats.step", e)
    if state.manifest_pending[0]:
        try:
            from tracer.sglang import autoload

            autoload.update_manifest_server()
        except Exception as e:
            state.note_failure("stats.manifest", e)


# ------------------------------------------------------------------ real Scheduler hooks
class _LoopState:
    """The previous loop iteration of a hooked ``Scheduler`` (for its step row)."""

    def __init__(self):
        self.t0 = 0  # perf_counter_ns at the top of the previous iteration
        self.mode = IDLE
        self.batch_size = 0
        self.num_tokens = 0
        self.last_idle_emit = 0


_loop = _LoopState()
_IDLE_SAMPLE_NS = int(float(os.environ.get("KVTRACE_IDLE_SAMPLE_MS", "1000")) * 1e6)


def _make_get_next_batch():
    def make(orig):
        def get_next_batch_to_run(self, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, *args, **kwargs)
            now = perf_counter_ns()
            try:
                lp = _loop
                if lp.t0:
                    idle = lp.mode == IDLE
                    if not idle or now - lp.last_idle_emit >= _IDLE_SAMPLE_NS:
                        if idle:
                            lp.last_idle_emit = now
                        step(lp.mode, lp.batch_size, lp.num_tokens, now - lp.t0,
                             forward_ct=int(getattr(self, "forward_ct", 0)))
                    else:
                        tracer.tick()
                lp.t0 = now
            except Exception as e:
                state.note_failure("stats.loop", e)
            out = orig(self, *args, **kwargs)
            try:
                batch = getattr(out, "batch_to_run", None)
                _loop.mode = _mode_of(batch)
                reqs = getattr(batch, "reqs", None) or ()
                _loop.batch_size = len(reqs)
                if _loop.mode in (PREFILL, MIXED):
                    _loop.num_tokens = int(getattr(batch, "extend_num_tokens", 0) or 0)
                else:
                    _loop.num_tokens = len(reqs)
                if _loop.mode != IDLE:
                    _loop.last_idle_emit = 0
            except Exception as e:
                state.note_failure("stats.loop_batch", e)
            return out

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
    """Take sglang's request-private-token helpers; hook ``Scheduler`` once it is imported.

    The scheduler module is never imported here (it pulls the whole serving stack); the
    autoload wraps it when the server imports it, and ``install()`` does if it is loaded.
    """
    from tracer.sglang.patching import target

    pso = target("sglang.srt.managers.scheduler_components.pool_stats_observer", lazy)
    if pso is not None:
        _helpers["full"], _helpers["swa"] = pso.kv_private_tokens, pso.kv_private_swa_tokens
    n = 0
    sched_mod = target("sglang.srt.managers.scheduler", True)
    if sched_mod is not None and hasattr(sched_mod, "Scheduler"):
        S = sched_mod.Scheduler
        n += patcher.wrap_method(S, "get_next_batch_to_run", _make_get_next_batch())
        n += patcher.wrap_method(S, "__init__", _make_scheduler_init())
    return n
