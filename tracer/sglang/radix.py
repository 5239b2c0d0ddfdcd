"""Hooks on ``UnifiedRadixCache`` (FULL+SWA, Rust or Python tree core) and the request-level
cache helpers of ``mem_cache/common.py``: one ``cache`` row per match, insert/checkpoint,
eviction, lock/unlock, out-of-window SWA release, release, load-back, backup and host eviction.

Only ``UnifiedRadixCache`` methods and module functions are wrapped, never tree-core internals,
so the default Rust core is covered. Token counts come from results the tree already returns
(``MatchResult``, ``EvictResult``, per-step eviction trackers), from CPU lengths
(``len(device_value)``) and from the tree's own size counters (lock ledger deltas): no device
sync.

Request attribution: ops that carry a request (``match_prefix(params.req)``, ``checkpoint(req)``,
``release_kv_cache(req)``, ``free_swa_out_of_window_slots(req)``, ``init_load_back``) set the
current request for the pool rows they cause.
"""

from __future__ import annotations

import sys
from time import perf_counter_ns

import tracer
from tracer.schema import CacheOp, RequestEvent
from tracer.sglang import state

_NOOP = state._NOOP
MATCH, INSERT, EVICT = int(CacheOp.MATCH), int(CacheOp.INSERT), int(CacheOp.EVICT)
LOCK, UNLOCK = int(CacheOp.LOCK), int(CacheOp.UNLOCK)
LOAD_BACK, BACKUP, HOST_EVICT = int(CacheOp.LOAD_BACK), int(CacheOp.BACKUP), int(CacheOp.HOST_EVICT)
SWA_RELEASE, RELEASE = int(CacheOp.SWA_RELEASE), int(CacheOp.RELEASE)

_rids_get = state._rids.get  # (the dict is cleared, never rebound)
_CT = {}  # ComponentType members, filled at install (FULL, SWA)
# Eviction accounting while inside _evict: [depth, nodes, tombstones]
_ev = [0, 0, 0]
# Checkpoint in progress: [depth, prefix_len of the (first) inner insert]
_ck = [0, 0]


def _dirty_cache(*args) -> None:
    """A ``cache`` row for an op that may change the tree's ledger (marks stats dirty)."""
    state.dirty[0] = True
    tracer.cache(*args)


def _swa_ct():
    return _CT.get("SWA")


def _protected(tree) -> tuple[int, int]:
    full = tree.full_protected_size()
    swa = tree.swa_protected_size() if tree.is_swa_enabled else 0
    return full, swa


# ------------------------------------------------------------------ tree methods
def _make_init():
    def make(orig):
        def init(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            try:
                from tracer.sglang.allocators import tag_swa

                state.registry.tree = self
                state.registry.allocator = self.token_to_kv_pool_allocator
                tag_swa(self.token_to_kv_pool_allocator)
                state.touch("tree")
            except Exception as e:
                state.note_failure("radix.init", e)

        return init

    return make


def _make_match():
    def make(orig):
        def match_prefix(self, params, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, params, *args, **kwargs)
            req = getattr(params, "req", None)
            if req is not None:
                try:  # state.rid_of(req), the common case (an id already seen) inlined
                    rid = _rids_get(req.rid)
                except Exception:
                    rid = None
                if rid is None:
                    rid = state.rid_of(req)
            else:
                rid = state.cur_rid[0]
            t0 = perf_counter_ns()
            out = orig(self, params, *args, **kwargs)
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
        def insert(self, params, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, params, *args, **kwargs)
            t0 = perf_counter_ns()
            out = orig(self, params, *args, **kwargs)
            try:
                prefix = int(getattr(out, "prefix_len", 0) or 0)
                if _ck[0]:
                    if _ck[1] < 0:
                        _ck[1] = prefix
                else:
                    key_len = len(params.key) if getattr(params, "key", None) is not None else 0
                    _dirty_cache(INSERT, state.cur_rid[0], prefix, 0, 0, max(0, key_len - prefix),
                                 0, 0, 0, 0, perf_counter_ns() - t0)
            except Exception as e:
                state.note_failure("radix.insert", e)
            return out

        return insert

    return make


def _make_checkpoint():
    def make(orig):
        def checkpoint(self, req, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, req, *args, **kwargs)
            rid = state.rid_of(req)
            try:
                before = req.kv.cache_protected_len
            except Exception:
                before = 0
            prev_rid, state.cur_rid[0] = state.cur_rid[0], rid
            _ck[0] += 1
            saved = _ck[1]
            _ck[1] = -1
            t0 = perf_counter_ns()
            try:
                return orig(self, req, *args, **kwargs)
            finally:
                dur = perf_counter_ns() - t0
                prefix = _ck[1]
                _ck[0] -= 1
                _ck[1] = saved
                state.cur_rid[0] = prev_rid
                try:
                    after = req.kv.cache_protected_len
                    _dirty_cache(INSERT, rid, max(prefix, 0), 0, 0, max(0, after - before),
                                 0, 0, 0, 0, dur)
                except Exception as e:
                    state.note_failure("radix.checkpoint", e)

        return checkpoint

    return make


def _make_evict():
    def make(orig):
        def _evict(self, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, *args, **kwargs)
            outer = _ev[0] == 0
            if outer:
                _ev[1] = _ev[2] = 0
            _ev[0] += 1
            t0 = perf_counter_ns()
            out = None
            try:
                out = orig(self, *args, **kwargs)
                return out
            finally:
                _ev[0] -= 1
                if outer and out is not None:
                    try:
                        _dirty_cache(EVICT, state.cur_rid[0], 0, 0, 0, out.num_tokens_evicted,
                                     out.swa_num_tokens_evicted, 0, _ev[1], _ev[2],
                                     perf_counter_ns() - t0)
                    except Exception as e:
                        state.note_failure("radix.evict", e)

        return _evict

    return make


def _make_accumulate():
    """Count evicted nodes and SWA tombstones from the per-step trackers of an eviction walk."""

    def make(orig):
        def _accumulate_tracker(self, tracker, delta, *args, **kwargs):
            if _ev[0] and delta:
                try:
                    full = delta.get(_CT["FULL"], 0)
                    swa = delta.get(_CT["SWA"], 0) if "SWA" in _CT else 0
                    if full > 0 or swa > 0:
                        _ev[1] += 1
                        if swa > 0 and full == 0:
                            _ev[2] += 1
                except Exception as e:
                    state.note_failure("radix.tracker", e)
            return orig(self, tracker, delta, *args, **kwargs)

        return _accumulate_tracker

    return make


# (tree class, core class) pairs whose protected sizes are the Rust binding's own counters
# (``UnifiedRadixCache.full_protected_size`` -> ``RustUnifiedTreeCore.full_protected_size`` ->
# ``_binding.full_protected_size()``): lock/unlock read the binding directly, skipping four
# Python frames per read. Filled at install with the sglang functions to compare against.
_RUST_ADAPTER = "sglang.srt.mem_cache.rust_tree_core.adapter"
_direct_fns: dict = {}
_direct_ok: dict = {}


def _direct_binding(tree):
    """The tree core's Rust binding when reading it directly gives the same protected sizes as
    the tree's own methods (unmodified sglang classes), else None."""
    core = tree.__dict__.get("tree_core")
    if core is None or not _direct_fns:
        return None
    key = (type(tree), type(core))
    ok = _direct_ok.get(key)
    if ok is None:
        f = _direct_fns
        tt, ct = type(tree), type(core)
        # the core's class is loaded whenever a core of it exists: its module is in sys.modules
        R = getattr(sys.modules.get(_RUST_ADAPTER), "RustUnifiedTreeCore", None)
        ok = _direct_ok[key] = R is not None and f["tree_full"] is not None and (
            getattr(tt, "full_protected_size", None) is f["tree_full"]
            and getattr(tt, "swa_protected_size", None) is f["tree_swa"]
            and getattr(ct, "full_protected_size", None) is R.__dict__.get("full_protected_size")
            and getattr(ct, "swa_protected_size", None) is R.__dict__.get("swa_protected_size"))
    return core.__dict__.get("_binding") if ok else None


def _make_lock(op: int):
    def make(orig):
        def lock_op(self, *args, **kwargs):
            pin = state.admission_pin
            if tracer.pool is _NOOP or (pin[0] and not pin[1]):
                return orig(self, *args, **kwargs)
            try:
                b = _direct_binding(self)
                if b is not None:
                    swa_on = self.is_swa_enabled
                    swa_i = _direct_fns["swa_int"]
                    f0 = b.full_protected_size()
                    s0 = b.component_protected_size(swa_i) if swa_on else 0
                else:
                    f0, s0 = _protected(self)
            except Exception:
                return orig(self, *args, **kwargs)
            t0 = perf_counter_ns()
            out = orig(self, *args, **kwargs)
            try:
                dur = perf_counter_ns() - t0
                if b is not None:
                    f1 = b.full_protected_size()
                    s1 = b.component_protected_size(swa_i) if swa_on else 0
                else:
                    f1, s1 = _protected(self)
                if f1 != f0 or s1 != s0:
                    state.dirty[0] = True
                tracer.cache(op, state.cur_rid[0], 0, 0, 0, abs(f1 - f0), abs(s1 - s0), 0, 1, 0,
                             dur)
            except Exception as e:
                state.note_failure("radix.lock", e)
            return out

        return lock_op

    return make


def _make_load_back():
    def make(orig):
        def init_load_back(self, params, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, params, *args, **kwargs)
            req = getattr(params, "req", None)
            rid = state.rid_of(req)
            prev_rid, state.cur_rid[0] = state.cur_rid[0], rid
            t0 = perf_counter_ns()
            out = None
            try:
                out = orig(self, params, *args, **kwargs)
                return out
            finally:
                state.cur_rid[0] = prev_rid
                try:
                    loaded = int(out[0]) if out else 0
                    host_hit = int(getattr(params, "host_hit_length", 0) or 0)
                    swa_hit = int(getattr(req, "swa_host_hit_length", 0) or 0) if req else 0
                    _dirty_cache(LOAD_BACK, rid, 0, host_hit, swa_hit, loaded, 0, host_hit, 0, 0,
                                 perf_counter_ns() - t0)
                except Exception as e:
                    state.note_failure("radix.load_back", e)

        return init_load_back

    return make


def _make_backup():
    def make(orig):
        def _execute_kv_backup(self, node_id, device_value, comp_xfers, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, node_id, device_value, comp_xfers, *args, **kwargs)
            t0 = perf_counter_ns()
            out = orig(self, node_id, device_value, comp_xfers, *args, **kwargs)
            try:
                swa = 0
                ct = _swa_ct()
                if ct is not None and comp_xfers:
                    for x in comp_xfers.get(ct, ()) or ():
                        idx = getattr(x, "device_indices", None)
                        swa += len(idx) if idx is not None else 0
                host = len(out) if out is not None else 0
                _dirty_cache(BACKUP, state.cur_rid[0], 0, 0, 0, len(device_value), swa, host, 1, 0,
                             perf_counter_ns() - t0)
            except Exception as e:
                state.note_failure("radix.backup", e)
            return out

        return _execute_kv_backup

    return make


def _make_evict_host():
    def make(orig):
        def evict_host(self, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, *args, **kwargs)
            t0 = perf_counter_ns()
            out = orig(self, *args, **kwargs)
            try:
                _dirty_cache(HOST_EVICT, state.cur_rid[0], 0, 0, 0, 0, 0, int(out or 0), 0, 0,
                             perf_counter_ns() - t0)
            except Exception as e:
                state.note_failure("radix.evict_host", e)
            return out

        return evict_host

    return make


# ------------------------------------------------------------------ common.py functions
def _make_release_kv_cache():
    def make(orig):
        def release_kv_cache(req, tree_cache, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(req, tree_cache, *args, **kwargs)
            rid = state.rid_of(req)
            try:
                kv = req.kv
                allocated, protected = int(kv.kv_allocated_len), int(kv.cache_protected_len)
            except Exception:
                allocated = protected = 0
            prev_rid, state.cur_rid[0] = state.cur_rid[0], rid
            t0 = perf_counter_ns()
            try:
                return orig(req, tree_cache, *args, **kwargs)
            finally:
                state.cur_rid[0] = prev_rid
                try:
                    _dirty_cache(RELEASE, rid, protected, 0, 0, max(0, allocated - protected), 0,
                                 0, 0, 0, perf_counter_ns() - t0)
                    if req.finished():
                        from tracer.sglang import requests

                        requests.emit_finish(req, rid)
                except Exception as e:
                    state.note_failure("radix.release", e)

        return release_kv_cache

    return make


def _make_free_swa_out_of_window():
    def make(orig):
        def free_swa_out_of_window_slots(req, pre_len, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(req, pre_len, *args, **kwargs)
            ct = kwargs.get("component_type") or _swa_ct()
            try:
                before = req.kv.get_evicted_seqlen(ct)
            except Exception:
                before = None
            rid = state.rid_of(req)
            prev_rid, state.cur_rid[0] = state.cur_rid[0], rid
            t0 = perf_counter_ns()
            try:
                return orig(req, pre_len, *args, **kwargs)
            finally:
                state.cur_rid[0] = prev_rid
                if before is not None:
                    try:
                        freed = req.kv.get_evicted_seqlen(ct) - before
                        if freed > 0:
                            _dirty_cache(SWA_RELEASE, rid, 0, 0, 0, 0, freed, 0, 0, 0,
                                         perf_counter_ns() - t0)
                    except Exception as e:
                        state.note_failure("radix.swa_release", e)

        return free_swa_out_of_window_slots

    return make


def install(patcher, lazy: bool = False) -> int:
    """Wrap ``UnifiedRadixCache`` and the ``common.py`` request helpers. Returns count."""
    from tracer.sglang.patching import target

    n = 0
    ctm = target("sglang.srt.mem_cache.unified_cache.component_type", lazy)
    if ctm is not None:
        _CT["FULL"] = ctm.ComponentType.FULL
        _CT["SWA"] = ctm.ComponentType.SWA
    urc = target("sglang.srt.mem_cache.unified_radix_cache", lazy)
    if urc is not None and _CT:
        U = urc.UnifiedRadixCache
        n += patcher.wrap_method(U, "__init__", _make_init())
        n += patcher.wrap_method(U, "match_prefix", _make_match())
        n += patcher.wrap_method(U, "insert", _make_insert())
        n += patcher.wrap_method(U, "checkpoint", _make_checkpoint())
        n += patcher.wrap_method(U, "_evict", _make_evict())
        n += patcher.wrap_method(U, "_accumulate_tracker", _make_accumulate())
        _direct_fns.update(tree_full=U.__dict__.get("full_protected_size"),
                           tree_swa=U.__dict__.get("swa_protected_size"),
                           swa_int=int(_CT["SWA"]))
        _direct_ok.clear()
        n += patcher.wrap_method(U, "lock", _make_lock(LOCK))
        n += patcher.wrap_method(U, "unlock", _make_lock(UNLOCK))
        n += patcher.wrap_method(U, "release_swa", _make_lock(UNLOCK))
        n += patcher.wrap_method(U, "init_load_back", _make_load_back())
        n += patcher.wrap_method(U, "_execute_kv_backup", _make_backup())
        n += patcher.wrap_method(U, "evict_host", _make_evict_host())
    common = target("sglang.srt.mem_cache.common", lazy)
    if common is not None and _CT:
        n += patcher.wrap_function(common, "release_kv_cache", _make_release_kv_cache())
        n += patcher.wrap_function(common, "free_swa_out_of_window_slots",
                                   _make_free_swa_out_of_window())
    return n
