"""Hooks on the request-level cache helpers of ``sglang.srt.mem_cache.common`` (module
functions, rebound in every sglang module that imported them by name):

- ``release_kv_cache(req, tree_cache, *, checkpoint)``: a ``release`` ``cache`` row (the
  request's protected prefix and private tokens), and the ``finish``/``abort`` ``request`` row
  of a finished request; at ``steps`` only the latter;
- ``free_swa_out_of_window_slots(...)`` (every decode step of a request past the window may
  call it): one ``swa_release`` row with the SWA slots it freed (from the evicted length lifted
  to ``swa_dead_lo``, which frees nothing, to the new one); ``counts``/``pages``.

Both attribute the pool rows they cause to their request (``S.cur_rid``).
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.schema import CacheOp
from tracer.sglang.hooks.unified_radix_cache import cache_row
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import requests, state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.targets.contract import LEVELS, Contract

SWA_RELEASE, RELEASE = int(CacheOp.SWA_RELEASE), int(CacheOp.RELEASE)


def _make_release_kv_cache():
    def make(orig):
        def release_kv_cache(req, tree_cache, *, checkpoint):
            if tracer.pool is NOOP:
                return orig(req, tree_cache, checkpoint=checkpoint)
            rid = state.rid_of(req)
            try:
                kv = req.kv
                allocated, protected = int(kv.kv_allocated_len), int(kv.cache_protected_len)
            except Exception:
                allocated = protected = 0
            prev_rid, S.cur_rid = S.cur_rid, rid
            t0 = perf_counter_ns()
            try:
                return orig(req, tree_cache, checkpoint=checkpoint)
            finally:
                S.cur_rid = prev_rid
                try:
                    cache_row(RELEASE, rid, protected, 0, 0, max(0, allocated - protected), 0,
                                 0, 0, 0, perf_counter_ns() - t0)
                    if req.finished():
                        requests.emit_finish(req, rid)
                except Exception as e:
                    state.note_failure("radix.release", e)

        return release_kv_cache

    return make


def _releases_nothing(req, pre_len, window, ct, interval) -> bool:
    """sglang 0.5.23's own early return of ``free_swa_out_of_window_slots`` (most calls: the
    window has not slid a whole ``eviction_interval`` since the last release), tested first so
    that those calls run with nothing read or attributed. False when it cannot be told."""
    try:
        kv = req.kv
        return pre_len - window < kv.component_evicted_seqlens.get(ct, 0) + interval
    except Exception:
        return False


def _swa_free_floor(req, ct, ps: int, before: int) -> int:
    """Where the call's free starts: sglang first lifts the evicted length to the lowest position
    the request may free itself (``swa_dead_lo`` for the SWA component, the tree-owned prefix
    otherwise), which frees nothing; every page from there to the new evicted length is freed
    (sglang expects each to hold an SWA peer). ``before`` where the request cannot tell."""
    try:
        kv = req.kv
        lo = kv.swa_dead_lo(ps) if getattr(ct, "name", None) == "SWA" else kv.cache_protected_len
        return max(before, int(lo))
    except Exception:
        return before


def _swa_release_pre(req, ct, ps):
    """(where the call's free starts, rid, previous rid), or None where the evicted length
    cannot be read; attributes the frees inside to ``req``."""
    try:
        before = req.kv.get_evicted_seqlen(ct)
    except Exception:
        before = None
    floor = None if before is None else _swa_free_floor(req, ct, ps, before)
    rid = state.rid_of(req)
    prev_rid, S.cur_rid = S.cur_rid, rid
    return floor, rid, prev_rid


def _swa_release_post(req, ct, pre, t0: int) -> None:
    """The ``swa_release`` row: the SWA slots the call freed, from the lifted floor to the new
    evicted length (the lift itself, below the floor, frees nothing)."""
    floor, rid, prev_rid = pre
    S.cur_rid = prev_rid
    if floor is None:
        return
    try:
        freed = req.kv.get_evicted_seqlen(ct) - floor
        if freed > 0:
            cache_row(SWA_RELEASE, rid, 0, 0, 0, 0, freed, 0, 0, 0, perf_counter_ns() - t0)
    except Exception as e:
        state.note_failure("radix.swa_release", e)


_SWA_RELEASE_PARAMS = (
    "(req, pre_len, *, sliding_window_size, page_size, req_to_token_pool, "
    "token_to_kv_pool_allocator, supports_prefix_sharing=True, retain_floor=None, "
    "component_type=<ComponentType.SWA: 1>, free_segment=None, eviction_interval=1)")
_COMMON = "sglang.srt.mem_cache.common"
_KV = "sglang.srt.managers.schedule_batch:ReqKvInfo."
CONTRACTS: tuple[Contract, ...] = (
    Contract("request.finish", _COMMON, None, "release_kv_cache",
             params="(req, tree_cache, *, checkpoint)", levels=LEVELS),
    Contract("cache.release", _COMMON, None, "release_kv_cache",
             params="(req, tree_cache, *, checkpoint)",
             reads=(_KV + "kv_allocated_len", _KV + "cache_protected_len")),
    Contract("cache.swa_release", _COMMON, None, "free_swa_out_of_window_slots",
             params=_SWA_RELEASE_PARAMS, reads=(_KV + "component_evicted_seqlens",
                                                _KV + "get_evicted_seqlen", _KV + "swa_dead_lo")),
)


def _make_free_swa_out_of_window():
    """``common.free_swa_out_of_window_slots`` (every decode step of a request past the window
    may call it): one ``swa_release`` row with the SWA tokens it released."""

    def make(orig):
        ct_default = (orig.__kwdefaults__ or {}).get("component_type")

        def free_swa_out_of_window_slots(
                req, pre_len, *, sliding_window_size, page_size, req_to_token_pool,
                token_to_kv_pool_allocator, supports_prefix_sharing=True, retain_floor=None,
                component_type=ct_default, free_segment=None, eviction_interval=1):
            pre = None
            if tracer.pool is not NOOP and not _releases_nothing(req, pre_len, sliding_window_size,
                                                                  component_type, eviction_interval):
                pre = _swa_release_pre(req, component_type, page_size)
            t0 = perf_counter_ns()
            try:
                return orig(req, pre_len, sliding_window_size=sliding_window_size,
                            page_size=page_size, req_to_token_pool=req_to_token_pool,
                            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                            supports_prefix_sharing=supports_prefix_sharing,
                            retain_floor=retain_floor, component_type=component_type,
                            free_segment=free_segment, eviction_interval=eviction_interval)
            finally:
                if pre is not None:
                    _swa_release_post(req, component_type, pre, t0)

        return free_swa_out_of_window_slots

    return make


def _make_finish_only():
    """Level ``steps``: only the ``finish``/``abort`` row of a finished request."""

    def make(orig):
        def release_kv_cache(req, tree_cache, *, checkpoint):
            out = orig(req, tree_cache, checkpoint=checkpoint)
            if tracer.pool is not NOOP:
                try:
                    if req.finished():
                        requests.emit_finish(req, state.rid_of(req))
                except Exception as e:
                    state.note_failure("steps.release", e)
            return out

        return release_kv_cache

    return make


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the ``common.py`` helpers (``lazy``: only if already imported). Returns count."""
    common = target("sglang.srt.mem_cache.common", lazy)
    if common is None:
        return 0
    if level == "steps":
        return patcher.wrap_function(common, "release_kv_cache", exact_only(
            "(req, tree_cache, *, checkpoint)", _make_finish_only()))
    n = patcher.wrap_function(common, "release_kv_cache", exact_only(
        "(req, tree_cache, *, checkpoint)", _make_release_kv_cache()))
    n += patcher.wrap_function(common, "free_swa_out_of_window_slots", exact_only(
        _SWA_RELEASE_PARAMS, _make_free_swa_out_of_window()))
    return n
