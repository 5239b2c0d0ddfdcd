"""Hooks on the fork's request-level cache helpers (``sglang.srt.mem_cache.common``; module
functions, rebound in every sglang module that imported them by name):

- ``release_kv_cache(req, tree_cache, is_insert=True, is_decode=False)``: a ``release``
  ``cache`` row (protected prefix, private tokens) and the ``finish`` / ``abort`` ``request``
  row of a finished request (at ``steps`` only the latter), as 0.5.23's ``release_kv_cache``;
- ``free_swa_out_of_window_slots(req, pre_len, *, ...)`` (#659 moved the decode SWA release
  here; its callers are ``ScheduleBatch._evict_swa`` and, opt-in, the SWA component at an
  unfinished insert): one ``swa_release`` row with the SWA tokens released (the advance of
  ``req.swa_evicted_seqlen``). Before #659 the release is inline in ``ScheduleBatch._evict_swa``
  (``fork/schedule_batch.py`` hooks that instead).

Both attribute the pool rows they cause to their request (``S.cur_rid``).
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.schema import CacheOp
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.hooks.unified_radix_cache import cache_row
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import requests, state
from tracer.sglang.runtime.state import NOOP, S

MOD = "sglang.srt.mem_cache.common"
SWA_RELEASE, RELEASE = int(CacheOp.SWA_RELEASE), int(CacheOp.RELEASE)
P_RELEASE = "(req, tree_cache, is_insert=True, is_decode=False)"
P_SWA = ("(req, pre_len, *, sliding_window_size, page_size, req_to_token_pool, "
         "token_to_kv_pool_allocator, is_chunk_cache=False, release_cache_protected_prefix=False)")
CONTRACTS = contracts(
    MOD,
    dict(hook="cache.release", cls=None, method="release_kv_cache", params=P_RELEASE,
         reads=("sglang.srt.managers.schedule_batch:Req.kv_allocated_len", "sglang.srt.managers.schedule_batch:Req.cache_protected_len"),
         pools=("full", "swa")),
    dict(hook="request.finish", cls=None, method="release_kv_cache", params=P_RELEASE,
         reads=("sglang.srt.managers.schedule_batch:Req.finished_reason", "sglang.srt.managers.schedule_batch:Req.output_ids"), levels=("steps", "counts", "pages")),
    dict(hook="cache.swa_release", cls=None,
         method="free_swa_out_of_window_slots", params=P_SWA,
         reads=("sglang.srt.managers.schedule_batch:Req.swa_evicted_seqlen",), optional=True, pools=("swa",)),
)


def _make_release(orig):
    def release_kv_cache(req, tree_cache, is_insert=True, is_decode=False):
        if tracer.pool is NOOP:
            return orig(req, tree_cache, is_insert, is_decode)
        rid = state.rid_of(req)
        try:
            allocated, protected = int(req.kv_allocated_len), int(req.cache_protected_len)
        except Exception:
            allocated = protected = 0
        prev_rid, S.cur_rid = S.cur_rid, rid
        t0 = perf_counter_ns()
        try:
            return orig(req, tree_cache, is_insert, is_decode)
        finally:
            S.cur_rid = prev_rid
            try:
                cache_row(RELEASE, rid, protected, 0, 0, max(0, allocated - protected), 0, 0, 0,
                          0, perf_counter_ns() - t0)
                if req.finished():
                    requests.emit_finish(req, rid)
            except Exception as e:
                state.note_failure("fork.radix.release", e)

    return release_kv_cache


def _make_finish_only(orig):
    def release_kv_cache(req, tree_cache, is_insert=True, is_decode=False):
        out = orig(req, tree_cache, is_insert, is_decode)
        if tracer.pool is not NOOP:
            try:
                if req.finished():
                    requests.emit_finish(req, state.rid_of(req))
            except Exception as e:
                state.note_failure("fork.steps.release", e)
        return out

    return release_kv_cache


def swa_release(req, call):
    """Run ``call()`` (an out-of-window SWA release of ``req``) attributed to ``req``; one
    ``swa_release`` row when ``req.swa_evicted_seqlen`` advanced (the outermost of nested
    releases writes it)."""
    if S.swa_release_depth:
        return call()
    try:
        before = int(req.swa_evicted_seqlen)
    except Exception:
        return call()
    prev_rid, S.cur_rid = S.cur_rid, state.rid_of(req)
    rid = S.cur_rid
    t0 = perf_counter_ns()
    S.swa_release_depth += 1
    try:
        return call()
    finally:
        S.swa_release_depth -= 1
        S.cur_rid = prev_rid
        try:
            freed = int(req.swa_evicted_seqlen) - before
            if freed > 0:
                cache_row(SWA_RELEASE, rid, 0, 0, 0, 0, freed, 0, 0, 0, perf_counter_ns() - t0)
        except Exception as e:
            state.note_failure("fork.radix.swa_release", e)


def _make_free_swa(orig):
    def free_swa_out_of_window_slots(req, pre_len, *, sliding_window_size, page_size,
                                     req_to_token_pool, token_to_kv_pool_allocator,
                                     is_chunk_cache=False, release_cache_protected_prefix=False):
        def call():
            return orig(req, pre_len, sliding_window_size=sliding_window_size,
                        page_size=page_size, req_to_token_pool=req_to_token_pool,
                        token_to_kv_pool_allocator=token_to_kv_pool_allocator,
                        is_chunk_cache=is_chunk_cache,
                        release_cache_protected_prefix=release_cache_protected_prefix)

        if tracer.pool is NOOP:
            return call()
        return swa_release(req, call)

    return free_swa_out_of_window_slots


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the fork's ``common.py`` helpers (``lazy``: only if imported). Returns count."""
    common = target(MOD, lazy)
    if common is None:
        return 0
    if level == "steps":
        return patcher.wrap_function(common, "release_kv_cache",
                                     exact_only(P_RELEASE, _make_finish_only))
    n = patcher.wrap_function(common, "release_kv_cache", exact_only(P_RELEASE, _make_release))
    if "free_swa_out_of_window_slots" in common.__dict__:  # (#659)
        n += patcher.wrap_function(common, "free_swa_out_of_window_slots",
                                   exact_only(P_SWA, _make_free_swa))
    return n
