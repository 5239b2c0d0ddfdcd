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
from tracer.schema import CacheOp
from tracer.sglang import state
from tracer.sglang.patching import exact_only

_NOOP = state._NOOP
MATCH, INSERT, EVICT = int(CacheOp.MATCH), int(CacheOp.INSERT), int(CacheOp.EVICT)
LOCK, UNLOCK = int(CacheOp.LOCK), int(CacheOp.UNLOCK)
LOAD_BACK, BACKUP, HOST_EVICT = int(CacheOp.LOAD_BACK), int(CacheOp.BACKUP), int(CacheOp.HOST_EVICT)
SWA_RELEASE, RELEASE = int(CacheOp.SWA_RELEASE), int(CacheOp.RELEASE)

_CT = {}  # ComponentType members, filled at install (FULL, SWA)
# Eviction accounting while inside _evict: [depth, nodes, tombstones]
_ev = [0, 0, 0]
# Checkpoint in progress: [depth, prefix_len of the (first) inner insert]
_ck = [0, 0]


def _dirty_cache(op, rid, device_hit, host_hit, swa_host_hit, full, swa, host, nodes, tombstones,
                 dur_ns) -> None:
    """A ``cache`` row for an op that may change the tree's ledger (marks stats dirty)."""
    state.dirty[0] = True
    tracer.cache(op, rid, device_hit, host_hit, swa_host_hit, full, swa, host, nodes, tombstones,
                 dur_ns)


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
        def match_prefix(self, params):
            if tracer.pool is _NOOP:
                return orig(self, params)
            req = getattr(params, "req", None)
            rid = state.cur_rid[0] if req is None else state.rid_of(req)
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
            if tracer.pool is _NOOP:
                return orig(self, params)
            t0 = perf_counter_ns()
            out = orig(self, params)
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
        def checkpoint(self, req, *, up_to, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, req, up_to=up_to, **kwargs)
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
                if kwargs:
                    return orig(self, req, up_to=up_to, **kwargs)
                return orig(self, req, up_to=up_to)
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
        def _evict(self, params, available_size_targets=None, *,
                   allocation_reclaim_satisfied=None):
            if tracer.pool is _NOOP:
                return orig(self, params, available_size_targets,
                            allocation_reclaim_satisfied=allocation_reclaim_satisfied)
            outer = _ev[0] == 0
            if outer:
                _ev[1] = _ev[2] = 0
            _ev[0] += 1
            t0 = perf_counter_ns()
            out = None
            try:
                out = orig(self, params, available_size_targets,
                           allocation_reclaim_satisfied=allocation_reclaim_satisfied)
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
        def _accumulate_tracker(self, tracker, delta):
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
            return orig(self, tracker, delta)

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


def _lock_rows(self, op: int, call, arg):
    """Run ``call(self, arg)`` and write one ``lock``/``unlock`` row with the change of the
    tree's protected sizes (the Rust binding's counters read directly when that is exact)."""
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
        return call(self, arg)
    t0 = perf_counter_ns()
    out = call(self, arg)
    try:
        dur = perf_counter_ns() - t0
        if b is not None:
            f1 = b.full_protected_size()
            s1 = b.component_protected_size(swa_i) if swa_on else 0
        else:
            f1, s1 = _protected(self)
        if f1 != f0 or s1 != s0:
            state.dirty[0] = True
        tracer.cache(op, state.cur_rid[0], 0, 0, 0, abs(f1 - f0), abs(s1 - s0), 0, 1, 0, dur)
    except Exception as e:
        state.note_failure("radix.lock", e)
    return out


def _make_lock():
    """``lock(node_id, skip_lock_components=())``. The selection's temporary pin inside
    ``PrefillAdder.add_one_req`` (most calls) returns at the first test."""

    def make(orig):
        def lock(self, node_id, skip_lock_components=()):
            pin = state.admission_pin
            if tracer.pool is _NOOP or (pin[0] and not pin[1]):
                return orig(self, node_id, skip_lock_components)
            if skip_lock_components:
                return _lock_rows(self, LOCK, lambda t, n: orig(t, n, skip_lock_components),
                                  node_id)
            return _lock_rows(self, LOCK, orig, node_id)

        return lock

    return make


def _make_unlock(op: int):
    """``unlock(lock)`` / ``release_swa(lock)``."""

    def make(orig):
        def unlock(self, lock):
            pin = state.admission_pin
            if tracer.pool is _NOOP or (pin[0] and not pin[1]):
                return orig(self, lock)
            return _lock_rows(self, op, orig, lock)

        return unlock

    return make


def _make_write_ack():
    """``_finish_write_through_ack(ack_id)``: a finished host backup drops the lock it held on
    its node through ``dec_lock_ref`` (not ``unlock``): one ``unlock`` row, rid -1 (shared)."""

    def make(orig):
        def _finish_write_through_ack(self, ack_id):
            if tracer.pool is _NOOP:
                return orig(self, ack_id)
            cur = state.cur_rid
            saved, cur[0] = cur[0], -1
            try:
                return _lock_rows(self, UNLOCK, orig, ack_id)
            finally:
                cur[0] = saved

        return _finish_write_through_ack

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
        def release_kv_cache(req, tree_cache, *, checkpoint):
            if tracer.pool is _NOOP:
                return orig(req, tree_cache, checkpoint=checkpoint)
            rid = state.rid_of(req)
            try:
                kv = req.kv
                allocated, protected = int(kv.kv_allocated_len), int(kv.cache_protected_len)
            except Exception:
                allocated = protected = 0
            prev_rid, state.cur_rid[0] = state.cur_rid[0], rid
            t0 = perf_counter_ns()
            try:
                return orig(req, tree_cache, checkpoint=checkpoint)
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


def _swa_release_pre(req, ct):
    """(SWA evicted length before, rid, previous rid); attributes the frees inside to ``req``."""
    try:
        before = req.kv.get_evicted_seqlen(ct)
    except Exception:
        before = None
    rid = state.rid_of(req)
    prev_rid, state.cur_rid[0] = state.cur_rid[0], rid
    return before, rid, prev_rid


def _swa_release_post(req, ct, pre, t0: int) -> None:
    before, rid, prev_rid = pre
    state.cur_rid[0] = prev_rid
    if before is not None:
        try:
            freed = req.kv.get_evicted_seqlen(ct) - before
            if freed > 0:
                _dirty_cache(SWA_RELEASE, rid, 0, 0, 0, 0, freed, 0, 0, 0, perf_counter_ns() - t0)
        except Exception as e:
            state.note_failure("radix.swa_release", e)


_SWA_RELEASE_PARAMS = (
    "(req, pre_len, *, sliding_window_size, page_size, req_to_token_pool, "
    "token_to_kv_pool_allocator, supports_prefix_sharing=True, retain_floor=None, "
    "component_type=<ComponentType.SWA: 1>, free_segment=None, eviction_interval=1)")


def _make_free_swa_out_of_window():
    """``common.free_swa_out_of_window_slots`` (every decode step of a request past the window
    may call it): one ``swa_release`` row with the SWA tokens it released."""

    def make(orig):
        ct_default = (orig.__kwdefaults__ or {}).get("component_type")

        def free_swa_out_of_window_slots(
                req, pre_len, *, sliding_window_size, page_size, req_to_token_pool,
                token_to_kv_pool_allocator, supports_prefix_sharing=True, retain_floor=None,
                component_type=ct_default, free_segment=None, eviction_interval=1):
            pre = None if tracer.pool is _NOOP else _swa_release_pre(req, component_type)
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
        n += patcher.wrap_method(U, "match_prefix", exact_only("(self, params)", _make_match()))
        n += patcher.wrap_method(U, "insert", exact_only("(self, params)", _make_insert()))
        n += patcher.wrap_method(U, "checkpoint",
                                 exact_only("(self, req, *, up_to, **kwargs)", _make_checkpoint()))
        n += patcher.wrap_method(U, "_evict", exact_only(
            "(self, params, available_size_targets=None, *, allocation_reclaim_satisfied=None)",
            _make_evict()))
        n += patcher.wrap_method(U, "_accumulate_tracker",
                                 exact_only("(self, tracker, delta)", _make_accumulate()))
        _direct_fns.update(tree_full=U.__dict__.get("full_protected_size"),
                           tree_swa=U.__dict__.get("swa_protected_size"),
                           swa_int=int(_CT["SWA"]))
        _direct_ok.clear()
        n += patcher.wrap_method(U, "lock",
                                 exact_only("(self, node_id, skip_lock_components=())", _make_lock()))
        n += patcher.wrap_method(U, "unlock", exact_only("(self, lock)", _make_unlock(UNLOCK)))
        n += patcher.wrap_method(U, "release_swa", exact_only("(self, lock)", _make_unlock(UNLOCK)))
        n += patcher.wrap_method(U, "init_load_back", _make_load_back())
        n += patcher.wrap_method(U, "_finish_write_through_ack",
                                 exact_only("(self, ack_id)", _make_write_ack()))
        n += patcher.wrap_method(U, "_execute_kv_backup", _make_backup())
        n += patcher.wrap_method(U, "evict_host", _make_evict_host())
    common = target("sglang.srt.mem_cache.common", lazy)
    if common is not None and _CT:
        n += patcher.wrap_function(common, "release_kv_cache", exact_only(
            "(req, tree_cache, *, checkpoint)", _make_release_kv_cache()))
        n += patcher.wrap_function(common, "free_swa_out_of_window_slots", exact_only(
            _SWA_RELEASE_PARAMS, _make_free_swa_out_of_window()))
    return n
