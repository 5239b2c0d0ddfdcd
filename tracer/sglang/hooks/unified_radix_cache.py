"""Hooks on ``UnifiedRadixCache`` (``sglang.srt.mem_cache.unified_radix_cache``; FULL+SWA, Rust
or Python tree core): one ``cache`` row per match, insert/checkpoint, eviction, load-back,
backup and host eviction. Lock rows are in ``unified_radix_cache_locks.py``, the request-level
helpers of ``mem_cache/common.py`` (release, out-of-window SWA release) in
``mem_cache_common.py``. At ``steps`` only ``__init__`` is wrapped (the sampler's registry).

Only ``UnifiedRadixCache`` methods are wrapped, never tree-core internals, so the default Rust
core is covered. Token counts come from results the tree already returns (``MatchResult``,
``EvictResult``, per-step eviction trackers), from CPU lengths (``len(device_value)``) and from
the tree's own size counters (lock ledger deltas): no device sync.

Request attribution: ops that carry a request (``match_prefix(params.req)``, ``checkpoint(req)``,
``init_load_back``) set the current request for the pool rows they cause.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.schema import CacheOp
from tracer.sglang.hooks import unified_radix_cache_locks
from tracer.sglang.hooks.allocator_common import tag_swa
from tracer.sglang.patching import exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import after_init, timed
from tracer.sglang.targets.contract import LEVELS, Contract

_URC = "sglang.srt.mem_cache.unified_radix_cache"
_CT = "sglang.srt.mem_cache.unified_cache.component_type:ComponentType"
CONTRACTS: tuple[Contract, ...] = (
    Contract("cache.tree", _URC, "UnifiedRadixCache", "__init__",
             reads=("token_to_kv_pool_allocator",), levels=LEVELS),
    Contract("cache.match", _URC, "UnifiedRadixCache", "match_prefix", params="(self, params)",
             reads=(_CT + ".FULL", _CT + ".SWA")),
    Contract("cache.insert", _URC, "UnifiedRadixCache", "insert", params="(self, params)"),
    Contract("cache.insert", _URC, "UnifiedRadixCache", "checkpoint",
             params="(self, req, *, up_to, **kwargs)"),
    Contract("cache.evict", _URC, "UnifiedRadixCache", "_evict", params=(
        "(self, params, available_size_targets=None, *, allocation_reclaim_satisfied=None)")),
    Contract("cache.evict", _URC, "UnifiedRadixCache", "_accumulate_tracker",
             params="(self, tracker, delta)"),
    Contract("cache.load_back", _URC, "UnifiedRadixCache", "init_load_back"),
    Contract("cache.backup", _URC, "UnifiedRadixCache", "_execute_kv_backup",
             params="(self, node_id, device_value, comp_xfers, sidecar_xfers)"),
    Contract("cache.host_evict", _URC, "UnifiedRadixCache", "evict_host"),
) + unified_radix_cache_locks.CONTRACTS

MATCH, INSERT, EVICT = int(CacheOp.MATCH), int(CacheOp.INSERT), int(CacheOp.EVICT)
LOAD_BACK, BACKUP, HOST_EVICT = int(CacheOp.LOAD_BACK), int(CacheOp.BACKUP), int(CacheOp.HOST_EVICT)

CT: dict = {}  # ComponentType members, filled at install (FULL, SWA)


class _Evict:
    """Eviction in progress (inside ``_evict``): depth, nodes evicted, SWA tombstones."""

    depth = nodes = tombstones = 0


class _Checkpoint:
    """Checkpoint in progress: depth, prefix_len of the (first) inner insert (-1: none yet)."""

    depth = prefix = 0


def cache_row(op, rid, device_hit, host_hit, swa_host_hit, full, swa, host, nodes, tombstones,
              dur_ns) -> None:
    """A ``cache`` row for an op that may change the tree's ledger (marks stats dirty)."""
    S.dirty = True
    tracer.cache(op, rid, device_hit, host_hit, swa_host_hit, full, swa, host, nodes, tombstones,
                 dur_ns)


def _tree_init(tree) -> None:
    state.registry.tree = tree
    state.registry.allocator = tree.token_to_kv_pool_allocator
    tag_swa(tree.token_to_kv_pool_allocator)
    state.touch("tree")


# ------------------------------------------------------------------ tree methods
def _make_match():
    def make(orig):
        def match_prefix(self, params):
            if tracer.pool is NOOP:
                return orig(self, params)
            req = getattr(params, "req", None)
            rid = S.cur_rid if req is None else state.rid_of(req)
            t0 = perf_counter_ns()
            out = orig(self, params)
            try:
                tracer.cache(MATCH, rid, out.device_prefix_len, out.host_hit_length,
                             out.swa_host_hit_length, 0, 0, 0, 0, 0, perf_counter_ns() - t0)
            except Exception as e:
                state.note_failure("radix.match", e)
            return out

        return match_prefix

    return make


def _make_insert():
    def make(orig):
        def insert(self, params):
            if tracer.pool is NOOP:
                return orig(self, params)
            t0 = perf_counter_ns()
            out = orig(self, params)
            try:
                prefix = int(getattr(out, "prefix_len", 0) or 0)
                if _Checkpoint.depth:
                    if _Checkpoint.prefix < 0:
                        _Checkpoint.prefix = prefix
                else:
                    key_len = len(params.key) if getattr(params, "key", None) is not None else 0
                    cache_row(INSERT, S.cur_rid, prefix, 0, 0, max(0, key_len - prefix),
                                 0, 0, 0, 0, perf_counter_ns() - t0)
            except Exception as e:
                state.note_failure("radix.insert", e)
            return out

        return insert

    return make


def _make_checkpoint():
    def make(orig):
        def checkpoint(self, req, *, up_to, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, req, up_to=up_to, **kwargs)
            rid = state.rid_of(req)
            try:
                before = req.kv.cache_protected_len
            except Exception:
                before = 0
            prev_rid, S.cur_rid = S.cur_rid, rid
            _Checkpoint.depth += 1
            saved = _Checkpoint.prefix
            _Checkpoint.prefix = -1
            t0 = perf_counter_ns()
            try:
                if kwargs:
                    return orig(self, req, up_to=up_to, **kwargs)
                return orig(self, req, up_to=up_to)
            finally:
                dur = perf_counter_ns() - t0
                prefix = _Checkpoint.prefix
                _Checkpoint.depth -= 1
                _Checkpoint.prefix = saved
                S.cur_rid = prev_rid
                try:
                    after = req.kv.cache_protected_len
                    cache_row(INSERT, rid, max(prefix, 0), 0, 0, max(0, after - before),
                                 0, 0, 0, 0, dur)
                except Exception as e:
                    state.note_failure("radix.checkpoint", e)

        return checkpoint

    return make


def _make_evict():
    def make(orig):
        def _evict(self, params, available_size_targets=None, *,
                   allocation_reclaim_satisfied=None):
            if tracer.pool is NOOP:
                return orig(self, params, available_size_targets,
                            allocation_reclaim_satisfied=allocation_reclaim_satisfied)
            outer = _Evict.depth == 0
            if outer:
                _Evict.nodes = _Evict.tombstones = 0
            _Evict.depth += 1
            t0 = perf_counter_ns()
            out = None
            try:
                out = orig(self, params, available_size_targets,
                           allocation_reclaim_satisfied=allocation_reclaim_satisfied)
                return out
            finally:
                _Evict.depth -= 1
                if outer and out is not None:
                    try:
                        cache_row(EVICT, S.cur_rid, 0, 0, 0, out.num_tokens_evicted,
                                     out.swa_num_tokens_evicted, 0, _Evict.nodes, _Evict.tombstones,
                                     perf_counter_ns() - t0)
                    except Exception as e:
                        state.note_failure("radix.evict", e)

        return _evict

    return make


def _make_accumulate():
    """Count evicted nodes and SWA tombstones from the per-step trackers of an eviction walk."""

    def make(orig):
        def _accumulate_tracker(self, tracker, delta):
            if _Evict.depth and delta:
                try:
                    full = delta.get(CT["FULL"], 0)
                    swa = delta.get(CT["SWA"], 0) if "SWA" in CT else 0
                    if full > 0 or swa > 0:
                        _Evict.nodes += 1
                        if swa > 0 and full == 0:
                            _Evict.tombstones += 1
                except Exception as e:
                    state.note_failure("radix.tracker", e)
            return orig(self, tracker, delta)

        return _accumulate_tracker

    return make


def _make_load_back():
    def make(orig):
        def init_load_back(self, params, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, params, *args, **kwargs)
            req = getattr(params, "req", None)
            rid = state.rid_of(req)
            prev_rid, S.cur_rid = S.cur_rid, rid
            t0 = perf_counter_ns()
            out = None
            try:
                out = orig(self, params, *args, **kwargs)
                return out
            finally:
                S.cur_rid = prev_rid
                try:
                    loaded = int(out[0]) if out else 0
                    host_hit = int(getattr(params, "host_hit_length", 0) or 0)
                    swa_hit = int(getattr(req, "swa_host_hit_length", 0) or 0) if req else 0
                    cache_row(LOAD_BACK, rid, 0, host_hit, swa_hit, loaded, 0, host_hit, 0, 0,
                                 perf_counter_ns() - t0)
                except Exception as e:
                    state.note_failure("radix.load_back", e)

        return init_load_back

    return make


def _account_backup(tree, out, dur_ns: int, args, kwargs) -> None:
    """``_execute_kv_backup(node_id, device_value, comp_xfers, ...)``: one ``backup`` row."""
    device_value, comp_xfers = args[1], args[2]
    swa = 0
    ct = CT.get("SWA")
    if ct is not None and comp_xfers:
        for x in comp_xfers.get(ct, ()) or ():
            idx = getattr(x, "device_indices", None)
            swa += len(idx) if idx is not None else 0
    host = len(out) if out is not None else 0
    cache_row(BACKUP, S.cur_rid, 0, 0, 0, len(device_value), swa, host, 1, 0, dur_ns)


def _account_evict_host(tree, out, dur_ns: int, args, kwargs) -> None:
    cache_row(HOST_EVICT, S.cur_rid, 0, 0, 0, 0, 0, int(out or 0), 0, 0, dur_ns)


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap ``UnifiedRadixCache`` (``lazy``: only if already imported). Returns count."""
    n = 0
    urc = target("sglang.srt.mem_cache.unified_radix_cache", lazy)
    if urc is None:
        return 0
    U = urc.UnifiedRadixCache
    n += patcher.wrap_method(U, "__init__", after_init("radix.init", _tree_init))
    if level == "steps":
        return n
    ctm = target("sglang.srt.mem_cache.unified_cache.component_type", lazy)
    if ctm is None:
        return n
    CT["FULL"] = ctm.ComponentType.FULL
    CT["SWA"] = ctm.ComponentType.SWA
    n += patcher.wrap_method(U, "match_prefix", exact_only("(self, params)", _make_match()))
    n += patcher.wrap_method(U, "insert", exact_only("(self, params)", _make_insert()))
    n += patcher.wrap_method(U, "checkpoint",
                             exact_only("(self, req, *, up_to, **kwargs)", _make_checkpoint()))
    n += patcher.wrap_method(U, "_evict", exact_only(
        "(self, params, available_size_targets=None, *, allocation_reclaim_satisfied=None)",
        _make_evict()))
    n += patcher.wrap_method(U, "_accumulate_tracker",
                             exact_only("(self, tracker, delta)", _make_accumulate()))
    n += unified_radix_cache_locks.install(patcher, U, int(CT["SWA"]))
    n += patcher.wrap_method(U, "init_load_back", _make_load_back())
    n += patcher.wrap_method(U, "_execute_kv_backup", timed("radix.backup", _account_backup))
    n += patcher.wrap_method(U, "evict_host", timed("radix.evict_host", _account_evict_host))
    return n
