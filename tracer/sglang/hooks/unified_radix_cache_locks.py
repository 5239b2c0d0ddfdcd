"""Lock rows of ``UnifiedRadixCache`` (``lock``, ``unlock``, ``release_swa`` and the HiCache
write-through ack): one ``lock``/``unlock`` ``cache`` row with the change of the tree's
protected sizes. Hand-written: lock and unlock run several times per step.

The selection's temporary pin of a candidate's prefix inside ``PrefillAdder.add_one_req`` (most
calls) returns at the first test and leaves no row (``S.pin_select``; ``schedule_policy.py``).
"""

from __future__ import annotations

import sys
from time import perf_counter_ns

import tracer
from tracer.schema import CacheOp
from tracer.sglang.patching import exact_only
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.targets.contract import Contract

LOCK, UNLOCK = int(CacheOp.LOCK), int(CacheOp.UNLOCK)

_URC = "sglang.srt.mem_cache.unified_radix_cache"
_READS = ("full_protected_size", "swa_protected_size", "is_swa_enabled")
CONTRACTS: tuple[Contract, ...] = (
    Contract("cache.lock", _URC, "UnifiedRadixCache", "lock",
             params="(self, node_id, skip_lock_components=())", reads=_READS),
    Contract("cache.lock", _URC, "UnifiedRadixCache", "unlock", params="(self, lock)"),
    Contract("cache.lock", _URC, "UnifiedRadixCache", "release_swa", params="(self, lock)"),
    Contract("cache.lock", _URC, "UnifiedRadixCache", "_finish_write_through_ack",
             params="(self, ack_id)"),
)


def _protected(tree) -> tuple[int, int]:
    full = tree.full_protected_size()
    swa = tree.swa_protected_size() if tree.is_swa_enabled else 0
    return full, swa


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
            S.dirty = True
        tracer.cache(op, S.cur_rid, 0, 0, 0, abs(f1 - f0), abs(s1 - s0), 0, 1, 0, dur)
    except Exception as e:
        state.note_failure("radix.lock", e)
    return out


def _make_lock():
    """``lock(node_id, skip_lock_components=())``. The selection's temporary pin inside
    ``PrefillAdder.add_one_req`` (most calls) returns at the first test."""

    def make(orig):
        def lock(self, node_id, skip_lock_components=()):
            if tracer.pool is NOOP or (S.pin_select and not S.pin_commit):
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
            if tracer.pool is NOOP or (S.pin_select and not S.pin_commit):
                return orig(self, lock)
            return _lock_rows(self, op, orig, lock)

        return unlock

    return make


def _make_write_ack():
    """``_finish_write_through_ack(ack_id)``: a finished host backup drops the lock it held on
    its node through ``dec_lock_ref`` (not ``unlock``): one ``unlock`` row, rid -1 (shared)."""

    def make(orig):
        def _finish_write_through_ack(self, ack_id):
            if tracer.pool is NOOP:
                return orig(self, ack_id)
            saved, S.cur_rid = S.cur_rid, -1
            try:
                return _lock_rows(self, UNLOCK, orig, ack_id)
            finally:
                S.cur_rid = saved

        return _finish_write_through_ack

    return make


def install(patcher, U, swa_component: int) -> int:
    """Wrap the lock methods of ``UnifiedRadixCache`` ``U``; ``swa_component``: the int of
    ``ComponentType.SWA`` (the Rust binding's component index). Returns count."""
    _direct_fns.update(tree_full=U.__dict__.get("full_protected_size"),
                       tree_swa=U.__dict__.get("swa_protected_size"), swa_int=swa_component)
    _direct_ok.clear()
    n = patcher.wrap_method(U, "lock",
                            exact_only("(self, node_id, skip_lock_components=())", _make_lock()))
    n += patcher.wrap_method(U, "unlock", exact_only("(self, lock)", _make_unlock(UNLOCK)))
    n += patcher.wrap_method(U, "release_swa", exact_only("(self, lock)", _make_unlock(UNLOCK)))
    n += patcher.wrap_method(U, "_finish_write_through_ack",
                             exact_only("(self, ack_id)", _make_write_ack()))
    return n
