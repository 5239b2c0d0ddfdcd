"""The per-step ``sched`` (kind ``step``) and ``stats`` rows: the step in progress and the sampler.

A step ends at a *boundary*: the top of the real ``Scheduler.get_next_batch_to_run`` (once the
previous iteration's results are processed), or, for loops that are not the real scheduler (the
real-code backend), ``SchedulerPoolStatsObserver.get_pool_stats`` (the scheduler's per-step pool
sample). The step's batch (mode, size, tokens) is noted by the ``ScheduleBatch.prepare_for_extend``
/ ``prepare_for_decode`` hooks (``hooks/schedule_batch.py``; the boundaries are hooked in
``hooks/scheduler.py``). At a boundary :func:`boundary` writes the step row, one ``stats`` row per
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
from dataclasses import dataclass
from time import perf_counter_ns

import tracer
from tracer.schema import Mode, Pool, SchedKind
from tracer.sglang.runtime import state
# held tokens, and sglang's helpers they use (``helpers``: filled by hooks/scheduler.py)
from tracer.sglang.runtime.held import held_tokens, helpers, swa_inline_ok  # noqa: F401
from tracer.sglang.runtime.state import NOOP, S

STEP = int(SchedKind.STEP)
FULL, SWA, HOST_FULL, HOST_SWA = int(Pool.FULL), int(Pool.SWA), int(Pool.HOST_FULL), int(Pool.HOST_SWA)
IDLE, PREFILL, DECODE, MIXED = int(Mode.IDLE), int(Mode.PREFILL), int(Mode.DECODE), int(Mode.MIXED)



def _env_ms(name: str, default: float) -> int:
    try:
        return int(float(os.environ.get(name, default)) * 1e6)
    except ValueError:
        return int(default * 1e6)


@dataclass(frozen=True)
class Cadence:
    """Sampling cadence: ``stats`` rows are written at a step boundary when something changed
    since the last sample (a pool, the tree's ledger, a request's KV) and at least ``interval_ns``
    passed (0: at every such step; < 0: at every step, changed or not). Idle steps write their
    step row at most once per ``idle_ns``."""

    interval_ns: int
    idle_ns: int


cadence = Cadence(_env_ms("KVTRACE_STATS_INTERVAL_MS", 10.0), _env_ms("KVTRACE_IDLE_SAMPLE_MS", 1000.0))


def configure(*, stats_interval_ms: float | None = None, idle_sample_ms: float | None = None) -> dict:
    """Set the sampling cadence; returns the settings in force (ms).

    Args:
        stats_interval_ms: minimum wall time between ``stats`` samples (default 10, env
            ``KVTRACE_STATS_INTERVAL_MS``); 0 samples at every step where something changed,
            a negative value at every step.
        idle_sample_ms: minimum wall time between two idle ``step`` rows (default 1000).
    """
    global cadence
    c = cadence
    cadence = Cadence(c.interval_ns if stats_interval_ms is None else int(stats_interval_ms * 1e6),
                      c.idle_ns if idle_sample_ms is None else int(idle_sample_ms * 1e6))
    return {"stats_interval_ms": cadence.interval_ns / 1e6, "idle_sample_ms": cadence.idle_ns / 1e6}


def sample(forward_ct: int | None = None) -> int:
    """Emit one ``stats`` row per known pool. Returns the number of rows (0 when not recording).

    Args:
        forward_ct: step number for the rows (default: the current step counter).
    """
    if tracer.pool is NOOP:
        return 0
    try:
        return _sample(S.forward_ct if forward_ct is None else forward_ct)
    except Exception as e:
        state.note_failure("stats.sample", e)
        return 0


def _tree_sizes():
    tree = state.registry.tree
    try:
        return None if tree is None else (int(tree.full_evictable_size()),
                                          int(tree.full_protected_size()))
    except Exception:
        return None


def _alloc_facts(alloc) -> tuple:
    """``(is_swa, ring, page_size)`` of a top-level allocator, cached on it (``_kvt_sample``):
    they are fixed when it is built, and the sampler reads them at every sample."""
    d = alloc.__dict__
    f = d.get("_kvt_sample")
    if f is None:
        is_swa = hasattr(alloc, "swa_available_size") and hasattr(alloc, "size_swa")
        f = d["_kvt_sample"] = (is_swa, bool(getattr(alloc, "_swa_req_ring", False)), alloc.page_size)
    return f


def _sample(fct: int) -> int:
    reg = state.registry
    ref = reg._tree  # (the registry's weak references, read without the properties' calls)
    tree = ref() if ref is not None else None
    ref = reg._allocator
    alloc = ref() if ref is not None else None
    if alloc is None and tree is not None:
        alloc = tree.token_to_kv_pool_allocator
    rows = 0
    stats = tracer.stats
    if alloc is not None:
        is_swa, ring, ps = _alloc_facts(alloc)
        full_held, swa_held = held_tokens(tree, ps, is_swa)
        if is_swa:
            full_cap, full_av = int(alloc.size_full), int(alloc.full_available_size())
        else:
            full_cap, full_av = int(alloc.size), int(alloc.available_size())
        if tree is not None:
            ev, pr = int(tree.full_evictable_size()), int(tree.full_protected_size())
        else:
            ev = pr = 0
        loop.last_tree = (ev, pr)
        stats(fct, FULL, full_cap, full_av, ev, pr, full_held)
        rows += 1
        if is_swa and not ring:
            tree_swa = tree is not None and getattr(tree, "is_swa_enabled", False)
            ev = int(tree.swa_evictable_size()) if tree_swa else 0
            pr = int(tree.swa_protected_size()) if tree_swa else 0
            stats(fct, SWA, int(alloc.size_swa), int(alloc.swa_available_size()), ev, pr, swa_held)
            rows += 1
    if reg.host_pools:  # (a WeakValueDictionary: iterating it is Python code, even when empty)
        for hp in list(reg.host_pools.values()):
            pool = hp.__dict__.get("_kvt_pool", HOST_FULL)
            if pool is None:
                continue
            cap = int(getattr(hp, "logical_size", hp.size))
            av = int(hp.available_size())
            stats(fct, pool, cap, av, cap - av, 0, 0)
            rows += 1
    return rows


def _run_on_step() -> None:
    """The one-shot ``S.on_step`` callback (the autoload's manifest update), then cleared."""
    fn, S.on_step = S.on_step, None
    try:
        fn()
    except Exception as e:
        state.note_failure("stats.on_step", e)


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
        stats: also sample the pools (when anything changed since the last sample and the
            cadence allows, see :class:`Cadence`).
    Mutates: ``S.forward_ct``.
    """
    if tracer.pool is NOOP:
        return
    try:
        fct = S.forward_ct + 1 if forward_ct is None else int(forward_ct)
        S.forward_ct = fct
        tracer.sched(STEP, fct, int(mode), int(batch_size), int(num_tokens), int(step_ns))
        interval = cadence.interval_ns
        if stats and (S.dirty or interval < 0):
            now = perf_counter_ns()
            if interval <= 0 or now - loop.last_sample >= interval:
                loop.last_sample = now
                S.dirty = False
                _sample(fct)
        # (the sched row above already refreshed the step clock, like tracer.tick())
    except Exception as e:
        state.note_failure("stats.step", e)
    if S.on_step is not None:
        _run_on_step()


# ------------------------------------------------------------------ the step in progress
class LoopState:
    """The step in progress (batch prepared since the last boundary, start time) and the
    sampler's memory (last sample time, tree sizes at the last sample). Reset for each new
    recording (a ``state.S.new_recording_listeners`` entry)."""

    __slots__ = ("t0", "mode", "batch_size", "num_tokens", "last_idle_emit", "scheduler_driven",
                 "observer", "last_sample", "last_tree")

    def __init__(self):
        self.t0 = 0  # perf_counter_ns at the previous boundary (0: none yet)
        self.mode = IDLE
        self.batch_size = 0
        self.num_tokens = 0
        self.last_idle_emit = 0
        self.scheduler_driven = False  # a real Scheduler loop drives the boundaries
        self.observer = 0  # id() of the stats observer last adopted (slots: no weakref)
        self.last_sample = 0  # perf_counter_ns of the last stats sample
        # (full evictable, full protected) of the tree at the last sample: an idle step samples
        # again when they changed outside the hooked methods (HiCache write-through acks
        # unlock nodes at idle).
        self.last_tree = None

    def note_batch(self, mode: int, batch_size: int, num_tokens: int) -> None:
        """The batch the step runs (a prefill then a decode in one step: ``mixed``)."""
        if tracer.pool is not S.emit_key:
            state.sync_recording()
        if self.t0 == 0:
            self.t0 = perf_counter_ns()
        if self.mode == PREFILL and mode == DECODE or self.mode == MIXED:
            self.mode = MIXED
            self.batch_size = max(self.batch_size, batch_size)
            self.num_tokens += num_tokens
        else:
            self.mode, self.batch_size, self.num_tokens = mode, batch_size, num_tokens


loop = LoopState()
S.new_recording_listeners.append(lambda rec: loop.__init__())

# id(ForwardMode member) -> Mode code (enum members are singletons; hashing an Enum is a
# Python-level call, hashing its id is not)
_modes: dict[int, int] = {}


def _mode_of(fm) -> int:
    m = _modes.get(id(fm))
    if m is None:
        if fm.is_idle():
            m = IDLE
        elif fm.is_mixed():
            m = MIXED
        elif fm.is_decode():
            m = DECODE
        elif fm.is_extend():
            m = PREFILL
        else:
            m = IDLE
        _modes[id(fm)] = m
    return m


def note_ran(batch) -> None:
    """The batch the step ran, read at the boundary (``Scheduler.get_next_batch_to_run``'s
    ``last_batch``) when no ``prepare_for_*`` hook noted it (level ``steps``: one hook per step
    instead of two). A batch that ran marks the pools changed for the sampler (no pool rows at
    that level)."""
    if batch is None:
        return
    fm = batch.forward_mode
    mode = _modes.get(id(fm))
    if mode is None:
        mode = _mode_of(fm)
    if mode == IDLE:
        return
    lp = loop
    bs = len(batch.reqs)
    lp.mode, lp.batch_size = mode, bs
    lp.num_tokens = bs if mode == DECODE else int(batch.extend_num_tokens or 0)
    S.dirty = True


def boundary(forward_ct: int | None = None) -> None:
    """End the step in progress: its ``step`` row (batch noted by the ``prepare_for_*`` hooks,
    wall time since the previous boundary) and the ``stats`` rows. Idle steps are sampled at
    most once per ``KVTRACE_IDLE_SAMPLE_MS``. (``step()`` inlined: this runs every step.)"""
    if tracer.pool is not S.emit_key:
        state.sync_recording()
    lp = loop
    now = perf_counter_ns()
    mode = lp.mode
    if mode == IDLE:
        if not lp.t0 or (lp.last_idle_emit and now - lp.last_idle_emit < cadence.idle_ns):
            lp.t0 = now  # the first boundary (no step before it), or idle spinning
            return
        lp.last_idle_emit = now
        if not S.dirty and lp.last_tree is not None and _tree_sizes() != lp.last_tree:
            S.dirty = True
    else:
        lp.last_idle_emit = 0
    fct = S.forward_ct + 1 if forward_ct is None else forward_ct
    S.forward_ct = fct
    tracer.sched(STEP, fct, mode, lp.batch_size, lp.num_tokens, now - lp.t0 if lp.t0 else 0)
    lp.t0 = now
    lp.mode, lp.batch_size, lp.num_tokens = IDLE, 0, 0
    interval = cadence.interval_ns
    if (S.dirty and (interval <= 0 or now - lp.last_sample >= interval)) or interval < 0:
        lp.last_sample = now
        S.dirty = False
        _sample(fct)
    if S.on_step is not None:
        _run_on_step()


__all__ = ["STEP", "FULL", "SWA", "HOST_FULL", "HOST_SWA", "IDLE", "PREFILL", "DECODE", "MIXED", "Cadence", "cadence",
           "configure", "sample", "step", "LoopState", "loop", "note_ran", "boundary",
           # re-exported from runtime/held.py (hooks/scheduler.py fills ``helpers``; tests call the others)
           "held_tokens", "helpers", "swa_inline_ok"]
