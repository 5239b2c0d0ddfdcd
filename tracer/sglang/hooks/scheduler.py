"""Hooks on the scheduler (``sglang.srt.managers.scheduler`` and its ``pool_stats_observer``
component): the step boundaries that end each step (``runtime.sampler.boundary``).

- ``Scheduler.__init__``: registers the scheduler and its ``ServerArgs`` (manifest, rank) and
  starts an armed autoload recording (``state.touch``);
- ``Scheduler.get_next_batch_to_run``: the real scheduler's boundary, the top of each loop
  iteration (the previous iteration's results are processed by then);
- ``SchedulerPoolStatsObserver.get_pool_stats``: the boundary of loops that are not the real
  ``Scheduler`` (the real-code backend calls it once per step, after processing the step).

Both boundary hooks make the loop's own tree and allocator the ones sampled (they may predate
``install``). Installed at every capture level.
"""

from __future__ import annotations

import tracer
from tracer.sglang.hooks.allocator_swa import tag_swa
from tracer.sglang.patching import exact as exact_factory
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import kv_bytes, sampler, state
from tracer.sglang.runtime.sampler import IDLE
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.targets.contract import LEVELS, Contract
from tracer.sglang.wrappers import before_init

_registry = state.registry

_PSO, _SCHED = ("sglang.srt.managers.scheduler_components.pool_stats_observer",
                "sglang.srt.managers.scheduler")
CONTRACTS: tuple[Contract, ...] = (
    Contract("stats.observer", _PSO, "SchedulerPoolStatsObserver", "get_pool_stats",
             params="(self)", reads=(_PSO + ":kv_private_swa_tokens", _PSO + ":ComponentType.SWA",
                                     "tree_cache", "token_to_kv_pool_allocator"), levels=LEVELS),
    Contract("sched.step", _SCHED, "Scheduler", "get_next_batch_to_run",
             params="(self, running_batch, last_batch)",
             reads=("forward_ct", "tree_cache", "token_to_kv_pool_allocator"), levels=LEVELS),
    Contract("sched.scheduler", _SCHED, "Scheduler", "__init__", levels=LEVELS),
)


def adopt(tree, alloc) -> None:
    """Make the loop's own tree/allocator the ones sampled (they may predate ``install``)."""
    reg = _registry
    if tree is not None and reg.tree is not tree and hasattr(tree, "full_evictable_size"):
        reg.tree = tree
    if alloc is not None and reg.allocator is not alloc:
        reg.allocator = alloc
        tag_swa(alloc)
    kv_bytes.note(tree, alloc)  # the pools' bytes per token into the rank entry (once per pools)


def _make_get_pool_stats():
    """Hand-written: runs once per step of the real-code backend."""

    def make(orig):
        def get_pool_stats(self):
            lp = sampler.loop
            if tracer.pool is not NOOP and not lp.scheduler_driven:
                try:
                    if tracer.pool is not S.emit_key:
                        state.sync_recording()
                    ref = _registry._tree  # (the registry's weak reference, read without a call)
                    if id(self) != lp.observer or ref is None or ref() is None:
                        lp.observer = id(self)
                        adopt(self.tree_cache, self.token_to_kv_pool_allocator)
                    sampler.boundary()
                except Exception as e:
                    state.note_failure("stats.get_pool_stats", e)
            return orig(self)

        return get_pool_stats

    return make


def _boundary_of(sched, last_batch) -> None:
    """The real ``Scheduler``'s boundary (the top of ``get_next_batch_to_run``): adopt its tree
    and allocator when it is another scheduler, take the batch that ran from ``last_batch``
    when no ``prepare_for_*`` hook noted one, end the step."""
    if tracer.pool is not S.emit_key:
        state.sync_recording()  # (a new recording resets the loop state first)
    lp = sampler.loop
    lp.scheduler_driven = True
    ref = _registry._tree  # (the registry's weak reference, read without a call)
    if id(sched) != lp.observer or ref is None or ref() is None:
        lp.observer = id(sched)
        adopt(getattr(sched, "tree_cache", None), getattr(sched, "token_to_kv_pool_allocator", None))
    if lp.mode == IDLE and last_batch is not None:
        sampler.note_ran(last_batch)
    sampler.boundary(sched.forward_ct)


def _make_get_next_batch():
    """Hand-written (once per step): ``get_next_batch_to_run(running_batch, last_batch)``."""

    def exact(orig):
        def get_next_batch_to_run(self, running_batch, last_batch):
            if tracer.pool is not NOOP:
                try:
                    _boundary_of(self, last_batch)
                except Exception as e:
                    state.note_failure("stats.loop", e)
            return orig(self, running_batch, last_batch)

        return get_next_batch_to_run

    def generic(orig):
        def get_next_batch_to_run(self, *args, **kwargs):
            if tracer.pool is not NOOP:
                try:
                    _boundary_of(self, kwargs.get("last_batch", args[1] if len(args) > 1 else None))
                except Exception as e:
                    state.note_failure("stats.loop", e)
            return orig(self, *args, **kwargs)

        return get_next_batch_to_run

    return exact_factory("(self, running_batch, last_batch)", exact, generic)


def _scheduler_init(self, args, kwargs) -> None:
    _registry.scheduler = self
    S.server_args = args[0] if args else kwargs.get("server_args")
    state.touch("scheduler")


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Hook the step boundaries (every level). The scheduler module is never imported here (it
    pulls the whole serving stack): the autoload wraps ``Scheduler`` when the server imports
    it, and ``install()`` does if it is loaded. Returns how many methods were wrapped now."""
    n = 0
    pso = target("sglang.srt.managers.scheduler_components.pool_stats_observer", lazy)
    if pso is not None:
        sampler.helpers["swa"] = pso.kv_private_swa_tokens
        sampler.helpers["swa_ct"] = pso.ComponentType.SWA
        n += patcher.wrap_method(pso.SchedulerPoolStatsObserver, "get_pool_stats",
                                 exact_only("(self)", _make_get_pool_stats()))
    sched_mod = target("sglang.srt.managers.scheduler", True)
    if sched_mod is not None and hasattr(sched_mod, "Scheduler"):
        S_ = sched_mod.Scheduler
        n += patcher.wrap_method(S_, "get_next_batch_to_run", _make_get_next_batch())
        n += patcher.wrap_method(S_, "__init__", before_init("stats.scheduler_init",
                                                              _scheduler_init))
    return n
