"""Hooks on the fork's scheduler (``sglang.srt.managers.scheduler`` and its
``scheduler_components.pool_stats_observer``): the step boundaries, as 0.5.23's
``hooks/scheduler.py``, and the fork's request-private (``held``) tokens for the ``stats`` rows.

- ``Scheduler.__init__``: registers the scheduler and its ``ServerArgs`` (manifest, rank),
  starts an armed autoload recording;
- ``Scheduler.get_next_batch_to_run()`` (no arguments in the fork: the batch that ran is the
  scheduler's own ``last_batch``): the boundary at the top of each loop iteration;
- ``SchedulerPoolStatsObserver.get_pool_stats()``: the boundary of loops that are not the real
  ``Scheduler`` (0.5.23's wrapper, reused).

``held`` (the fork has no ``kv_private_swa_tokens``): per request holding a KV row (not yet
freed), full = page-ceiled ``kv_allocated_len`` - ``cache_protected_len``; SWA = page-ceiled
``kv_allocated_len`` - max(``cache_protected_len``, ``swa_evicted_seqlen``): the terms of the
fork's own busy leak check (``invariant_checker._get_total_uncached_sizes``), plus the tree's
session-held tokens of rows no live request holds. Installed by rebinding the sampler's
``held_tokens`` (restored by ``uninstall``).
"""

from __future__ import annotations

import tracer
from tracer.sglang.hooks import scheduler as base
from tracer.sglang.hooks.fork import dsv4
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.patching import target
from tracer.sglang.runtime import sampler, state
from tracer.sglang.runtime.state import NOOP
from tracer.sglang.wrappers import before_init

MOD = "sglang.srt.managers.scheduler"
PSO = "sglang.srt.managers.scheduler_components.pool_stats_observer"
_all = ("steps", "counts", "pages")
CONTRACTS = contracts(
    MOD,
    dict(hook="sched.scheduler", cls="Scheduler", method="__init__", levels=_all),
    dict(hook="sched.step", cls="Scheduler", method="get_next_batch_to_run",
         params="(self)", reads=("last_batch", "forward_ct", "tree_cache",
                                 "token_to_kv_pool_allocator"), levels=_all,
         pools=("full", "swa", "host_full", "host_swa")),
) + contracts(
    PSO,
    dict(hook="stats.observer", cls="SchedulerPoolStatsObserver",
         method="get_pool_stats", params="(self)",
         reads=("tree_cache", "token_to_kv_pool_allocator"), levels=_all, optional=True),
)


def held_tokens(tree, ps: int, swa: bool) -> tuple[int, int]:
    """(full, swa) request-private tokens of the fork's requests and sessions (see module)."""
    full = swa_held = 0
    idxs = set()
    for r in list(state.registry.live_reqs.values()):
        idx = r.req_pool_idx
        if idx is None or r.kv_committed_freed:
            continue
        idxs.add(idx)
        alloc = -(-r.kv_allocated_len // ps) * ps if ps > 1 else r.kv_allocated_len
        prot = r.cache_protected_len
        full += alloc - prot
        if swa:
            ev = r.swa_evicted_seqlen
            swa_held += alloc - (ev if ev > prot else prot)
    if tree is not None:
        try:
            full += int(tree.session_held_full_tokens(idxs))
            if swa:
                swa_held += int(tree.session_held_swa_tokens(idxs))
        except Exception:  # (no streaming-session support on this tree)
            pass
    return full, swa_held


def _adopt(tree, alloc) -> None:
    if tree is not None and "is_swa_enabled" not in tree.__dict__ and hasattr(tree, "supports_swa"):
        tree.__dict__["is_swa_enabled"] = bool(tree.supports_swa())
    base.adopt(tree, alloc)


def _boundary(sched) -> None:
    lp = sampler.loop
    if id(sched) != lp.observer:
        _adopt(getattr(sched, "tree_cache", None), getattr(sched, "token_to_kv_pool_allocator", None))
        dsv4.note(sched)
    base._boundary_of(sched, sched.last_batch)


def _make_get_next_batch(orig):
    def get_next_batch_to_run(self):
        if tracer.pool is not NOOP:
            try:
                _boundary(self)
            except Exception as e:
                state.note_failure("fork.stats.loop", e)
        return orig(self)

    return get_next_batch_to_run


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Hook the step boundaries (every level) and the fork's ``held``. The scheduler module is
    never imported here (it pulls the serving stack); it is wrapped once the server imports it."""
    from tracer.sglang.patching import exact_only

    n = patcher.wrap_function(sampler, "held_tokens",
                              lambda orig: lambda tree, ps, swa: held_tokens(tree, ps, swa))
    pso = target(PSO, lazy)
    if pso is not None:
        n += patcher.wrap_method(pso.SchedulerPoolStatsObserver, "get_pool_stats",
                                 exact_only("(self)", base._make_get_pool_stats()))
    sched_mod = target(MOD, True)
    if sched_mod is not None and hasattr(sched_mod, "Scheduler"):
        Sch = sched_mod.Scheduler
        n += patcher.wrap_method(Sch, "get_next_batch_to_run",
                                 exact_only("(self)", _make_get_next_batch))
        n += patcher.wrap_method(Sch, "__init__", before_init("fork.stats.scheduler_init",
                                                              base._scheduler_init))
    return n
