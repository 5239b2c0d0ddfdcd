"""Hooks on the fork's ``UnifiedRadixCache`` (``sglang.srt.mem_cache.unified_radix_cache``; pure
Python tree, FULL+SWA components): the ``cache`` rows of 0.5.23's ``hooks/unified_radix_cache.py``
with the same meaning, through the fork's own tree API. Lock rows: ``unified_radix_cache_locks``.

=====================  =========================================================================
row                    fork method wrapped
=====================  =========================================================================
``match``              ``match_prefix(params)``: device, host and SWA-host hit lengths
``insert``             ``cache_unfinished_req`` / ``cache_finished_req`` (0.5.23's checkpoint):
                       prefix already in the tree (its inner ``insert``'s ``prefix_len``) and
                       the tokens newly owned by the tree (inserted key length - the request's
                       ``cache_protected_len`` before); a bare ``insert`` elsewhere: key - prefix
``evict``              ``evict(params)``: full and SWA tokens from its ``EvictResult``; nodes and
                       SWA tombstones counted from ``_evict_component_and_detach_lru`` inside it
``load_back``          ``init_load_back(params)``: host hit, tokens loaded
``backup``             ``write_backup(node, write_back)``: one row per node backed up
``host_evict``         ``evict_host(num_tokens, component_type)``
=====================  =========================================================================

``__init__`` registers the tree for the sampler at every level and sets ``is_swa_enabled``
(``supports_swa()``; a name the fork never reads) so the sampler and lock rows read its SWA sizes.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.schema import CacheOp
from tracer.sglang.hooks.allocator_common import tag_swa
from tracer.sglang.hooks.fork import unified_radix_cache_locks as locks
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.hooks.unified_radix_cache import cache_row
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import after_init

MOD = "sglang.srt.mem_cache.unified_radix_cache"
CT_MOD = "sglang.srt.mem_cache.unified_cache_components"
MATCH, INSERT, EVICT = int(CacheOp.MATCH), int(CacheOp.INSERT), int(CacheOp.EVICT)
LOAD_BACK, BACKUP, HOST_EVICT = int(CacheOp.LOAD_BACK), int(CacheOp.BACKUP), int(CacheOp.HOST_EVICT)
P_FINISHED = "(self, req, is_insert=True, **kwargs)"
P_UNFINISHED = "(self, req, chunked=False, **kwargs)"
_U = "UnifiedRadixCache"
CONTRACTS = contracts(
    MOD,
    dict(hook="cache.tree", cls=_U, method="__init__", reads=("token_to_kv_pool_allocator",),
         levels=("steps", "counts", "pages"), pools=("full", "swa")),
    dict(hook="cache.match", cls=_U, method="match_prefix", params="(self, params)",
         reads=("MatchResult.device_indices",)),
    dict(hook="cache.insert", cls=_U, method="insert", params="(self, params)"),
    dict(hook="cache.insert", cls=_U, method="cache_unfinished_req", params=P_UNFINISHED,
         reads=("sglang.srt.managers.schedule_batch:Req.cache_protected_len",)),
    dict(hook="cache.insert", cls=_U, method="cache_finished_req", params=P_FINISHED,
         reads=("sglang.srt.managers.schedule_batch:Req.cache_protected_len",)),
    dict(hook="cache.evict", cls=_U, method="evict", params="(self, params)"),
    dict(hook="cache.evict", cls=_U, method="_evict_component_and_detach_lru"),
    dict(hook="cache.load_back", cls=_U, method="init_load_back", params="(self, params)"),
    dict(hook="cache.backup", cls=_U, method="write_backup",
         params="(self, node, write_back=False)"),
    dict(hook="cache.host_evict", cls=_U, method="evict_host"),
) + locks.CONTRACTS

CT: dict = {}  # FULL, SWA ComponentType members and EvictLayer.DEVICE (set at install)


class _Evict:
    """Eviction in progress: depth, and per node id the components whose device data it freed."""

    depth = 0
    nodes: dict = {}


class _Ins:
    """Cache-a-request in progress: depth, (prefix_len, key_len) of its inner insert."""

    depth = 0
    result = None


def _tree_init(tree) -> None:
    tree.__dict__["is_swa_enabled"] = bool(tree.supports_swa())
    state.registry.tree = tree
    alloc = tree.token_to_kv_pool_allocator
    if alloc is not None:
        state.registry.allocator = alloc
        tag_swa(alloc)
    state.touch("tree")


def _make_match(orig):
    def match_prefix(self, params):
        if tracer.pool is NOOP or _Ins.depth:  # (cache_unfinished_req's own re-match: no row)
            return orig(self, params)
        req = params.req
        rid = S.cur_rid if req is None else state.rid_of(req)
        t0 = perf_counter_ns()
        out = orig(self, params)
        try:
            tracer.cache(MATCH, rid, len(out.device_indices), out.host_hit_length,
                         out.swa_host_hit_length, 0, 0, 0, 0, 0, perf_counter_ns() - t0)
        except Exception as e:
            state.note_failure("fork.radix.match", e)
        return out

    return match_prefix


def _make_insert(orig):
    def insert(self, params):
        if tracer.pool is NOOP:
            return orig(self, params)
        t0 = perf_counter_ns()
        out = orig(self, params)
        try:
            prefix = int(getattr(out, "prefix_len", 0) or 0)
            key_len = len(params.key) if params.key is not None else 0
            if _Ins.depth:
                if _Ins.result is None:
                    _Ins.result = (prefix, key_len)
            else:
                cache_row(INSERT, S.cur_rid, prefix, 0, 0, max(0, key_len - prefix), 0, 0, 0, 0,
                          perf_counter_ns() - t0)
        except Exception as e:
            state.note_failure("fork.radix.insert", e)
        return out

    return insert


def _cache_req(tree, req, call):
    """Run ``call()`` (a ``cache_*_req``) attributed to ``req``; one ``insert`` row."""
    rid = state.rid_of(req)
    try:
        before = int(req.cache_protected_len)
    except Exception:
        before = 0
    prev_rid, S.cur_rid = S.cur_rid, rid
    _Ins.depth += 1
    saved, _Ins.result = _Ins.result, None
    t0 = perf_counter_ns()
    try:
        return call()
    finally:
        dur = perf_counter_ns() - t0
        res, _Ins.result = _Ins.result, saved
        _Ins.depth -= 1
        S.cur_rid = prev_rid
        if res is not None:
            try:
                cache_row(INSERT, rid, res[0], 0, 0, max(0, res[1] - before), 0, 0, 0, 0, dur)
            except Exception as e:
                state.note_failure("fork.radix.checkpoint", e)


def _make_finished(orig):
    def cache_finished_req(self, req, is_insert=True, **kwargs):
        if tracer.pool is NOOP:
            return orig(self, req, is_insert, **kwargs)
        return _cache_req(self, req, lambda: orig(self, req, is_insert, **kwargs))

    return cache_finished_req


def _make_unfinished(orig):
    def cache_unfinished_req(self, req, chunked=False, **kwargs):
        if tracer.pool is NOOP:
            return orig(self, req, chunked, **kwargs)
        return _cache_req(self, req, lambda: orig(self, req, chunked, **kwargs))

    return cache_unfinished_req


def _make_evict(orig):
    def evict(self, params):
        if tracer.pool is NOOP:
            return orig(self, params)
        outer = _Evict.depth == 0
        if outer:
            _Evict.nodes = {}
        _Evict.depth += 1
        t0 = perf_counter_ns()
        out = None
        try:
            out = orig(self, params)
            return out
        finally:
            _Evict.depth -= 1
            if outer and out is not None:
                try:
                    nodes = _Evict.nodes
                    full, swa = CT["FULL"], CT.get("SWA")
                    tomb = sum(1 for cts in nodes.values() if swa in cts and full not in cts)
                    cache_row(EVICT, S.cur_rid, 0, 0, 0, int(out.num_tokens_evicted),
                              int(out.swa_num_tokens_evicted), 0, len(nodes), tomb,
                              perf_counter_ns() - t0)
                except Exception as e:
                    state.note_failure("fork.radix.evict", e)
                _Evict.nodes = {}

    return evict


def _make_detach(orig):
    """``_evict_component_and_detach_lru(node, comp, target, tracker)`` -> (device, host)
    freed: inside an eviction, note which components' device data each node lost."""

    def _evict_component_and_detach_lru(self, node, comp, *args, **kwargs):
        out = orig(self, node, comp, *args, **kwargs)
        if _Evict.depth:
            try:
                if out[0] > 0:
                    _Evict.nodes.setdefault(id(node), set()).add(comp.component_type)
            except Exception as e:
                state.note_failure("fork.radix.tracker", e)
        return out

    return _evict_component_and_detach_lru


def _make_load_back(orig):
    def init_load_back(self, params):
        if tracer.pool is NOOP:
            return orig(self, params)
        req = params.req
        rid = state.rid_of(req)
        prev_rid, S.cur_rid = S.cur_rid, rid
        S.pin_commit += 1  # (its locks are kept past the admission's selection pin: recorded)
        t0 = perf_counter_ns()
        out = None
        try:
            out = orig(self, params)
            return out
        finally:
            S.pin_commit -= 1
            S.cur_rid = prev_rid
            try:
                loaded = len(out[0]) if out is not None else 0
                host_hit = int(params.host_hit_length or 0)
                swa_hit = int(getattr(req, "swa_host_hit_length", 0) or 0) if req else 0
                cache_row(LOAD_BACK, rid, 0, host_hit, swa_hit, loaded, 0, host_hit, 0, 0,
                          perf_counter_ns() - t0)
            except Exception as e:
                state.note_failure("fork.radix.load_back", e)

    return init_load_back


def _make_backup(orig):
    def write_backup(self, node, write_back=False):
        if tracer.pool is NOOP:
            return orig(self, node, write_back)
        swa_ct = CT.get("SWA")
        try:
            cds = node.component_data
            swa0 = cds[swa_ct].host_value if swa_ct is not None and self.is_swa_enabled else None
            full = cds[CT["FULL"]].value
            full_len = len(full) if full is not None else 0
        except Exception:
            return orig(self, node, write_back)
        t0 = perf_counter_ns()
        out = orig(self, node, write_back)
        try:
            if out:
                swa1 = node.component_data[swa_ct].host_value if swa0 is None and \
                    swa_ct is not None and self.is_swa_enabled else None
                swa = len(swa1) if swa1 is not None else 0
                cache_row(BACKUP, S.cur_rid, 0, 0, 0, full_len, swa, int(out), 1, 0,
                          perf_counter_ns() - t0)
        except Exception as e:
            state.note_failure("fork.radix.backup", e)
        return out

    return write_backup


def _make_evict_host(orig):
    def evict_host(self, *args, **kwargs):
        if tracer.pool is NOOP:
            return orig(self, *args, **kwargs)
        t0 = perf_counter_ns()
        out = orig(self, *args, **kwargs)
        try:
            cache_row(HOST_EVICT, S.cur_rid, 0, 0, 0, 0, 0, int(out or 0), 0, 0,
                      perf_counter_ns() - t0)
        except Exception as e:
            state.note_failure("fork.radix.evict_host", e)
        return out

    return evict_host


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the fork's ``UnifiedRadixCache`` (``lazy``: only if imported). Returns count."""
    urc = target(MOD, lazy)
    if urc is None:
        return 0
    U = urc.UnifiedRadixCache
    n = patcher.wrap_method(U, "__init__", after_init("fork.radix.init", _tree_init))
    if level == "steps":
        return n
    ctm = target(CT_MOD, lazy)
    if ctm is None:
        return n
    CT["FULL"], CT["SWA"] = ctm.ComponentType.FULL, ctm.ComponentType.SWA
    n += patcher.wrap_method(U, "match_prefix", exact_only("(self, params)", _make_match))
    n += patcher.wrap_method(U, "insert", exact_only("(self, params)", _make_insert))
    n += patcher.wrap_method(U, "cache_finished_req", exact_only(P_FINISHED, _make_finished))
    n += patcher.wrap_method(U, "cache_unfinished_req",
                             exact_only(P_UNFINISHED, _make_unfinished))
    n += patcher.wrap_method(U, "evict", exact_only("(self, params)", _make_evict))
    n += patcher.wrap_method(U, "_evict_component_and_detach_lru", _make_detach)
    n += patcher.wrap_method(U, "init_load_back", exact_only("(self, params)", _make_load_back))
    n += patcher.wrap_method(U, "write_backup",
                             exact_only("(self, node, write_back=False)", _make_backup))
    n += patcher.wrap_method(U, "evict_host", _make_evict_host)
    n += locks.install(patcher, U)
    return n
