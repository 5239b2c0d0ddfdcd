"""The hooks of capture level ``steps`` besides the step boundary (``stats``) and arrivals
(``requests``): what the per-step ``stats`` sampler and the ``finish`` rows need, and no more.

At ``detail="steps"`` a trace holds ``request`` rows, ``sched`` step rows and ``stats`` rows:
enough to replay it (arrivals with their page hashes) and to see occupancy grow (the pools'
identity at every sample). The per-op families (``pool``, ``cache``, admission ``sched`` rows)
are not hooked at all: fewer wrapped calls is what makes this level cheap (docs/capture.md).

Wrapped here (each runs once per request or once per object, never per step):

- ``UnifiedRadixCache.__init__``: the tree and its allocator the sampler reads (registry);
- ``ReqToTokenPool.alloc`` / ``free`` / ``clear``: the requests holding a KV row (the sampler's
  ``held`` sum), no rows;
- ``common.release_kv_cache``: the ``finish`` / ``abort`` row of a finished request;
- host pools' ``__init__`` and ``HostPoolGroup``: the host pools sampled (``host_pool``).

Every ``stats`` sample at this level is taken on a step that ran a batch (nothing marks pools
dirty here), at most once per ``stats_interval_ms``.
"""

from __future__ import annotations

import tracer
from tracer.sglang import state
from tracer.sglang.patching import exact_only

_NOOP = state._NOOP


def _make_req_alloc():
    def make(orig):
        def alloc(self, reqs, *args, **kwargs):
            out = orig(self, reqs, *args, **kwargs)
            if out is not None and tracer.pool is not _NOOP:
                live = state.registry.live_reqs
                for r in reqs:
                    live[id(r)] = r
            return out

        return alloc

    return make


def _make_req_free():
    def make(orig):
        def free(self, req, *args, **kwargs):
            state.registry.live_reqs.pop(id(req), None)
            return orig(self, req, *args, **kwargs)

        return free

    return make


def _make_req_clear():
    def make(orig):
        def clear(self, *args, **kwargs):
            state.registry.live_reqs.clear()
            return orig(self, *args, **kwargs)

        return clear

    return make


def _make_release_kv_cache():
    def make(orig):
        def release_kv_cache(req, tree_cache, *, checkpoint):
            out = orig(req, tree_cache, checkpoint=checkpoint)
            if tracer.pool is not _NOOP:
                try:
                    if req.finished():
                        from tracer.sglang import requests

                        requests.emit_finish(req, state.rid_of(req))
                except Exception as e:
                    state.note_failure("steps.release", e)
            return out

        return release_kv_cache

    return make


def install(patcher, lazy: bool = False) -> int:
    """Wrap what level ``steps`` needs (``lazy``: only modules already imported). Returns count."""
    from tracer.sglang import host_pool, radix
    from tracer.sglang.patching import target

    n = 0
    urc = target("sglang.srt.mem_cache.unified_radix_cache", lazy)
    if urc is not None:
        n += patcher.wrap_method(urc.UnifiedRadixCache, "__init__", radix._make_init())
    mp = target("sglang.srt.mem_cache.memory_pool", lazy)
    if mp is not None:
        R = mp.ReqToTokenPool
        n += patcher.wrap_method(R, "alloc", _make_req_alloc())
        n += patcher.wrap_method(R, "free", _make_req_free())
        n += patcher.wrap_method(R, "clear", _make_req_clear())
    common = target("sglang.srt.mem_cache.common", lazy)
    if common is not None:
        n += patcher.wrap_function(common, "release_kv_cache", exact_only(
            "(req, tree_cache, *, checkpoint)", _make_release_kv_cache()))
    n += host_pool.install_registry(patcher, lazy)
    return n
