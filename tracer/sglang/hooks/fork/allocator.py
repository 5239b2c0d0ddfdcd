"""Hooks on the DeepSeek-V4 fork's device allocator leaves (``sglang.srt.mem_cache.allocator``:
``TokenToKVPoolAllocator``, ``PagedTokenToKVPoolAllocator`` and subclasses such as the NPU paged
allocator): every change of a leaf's free list becomes one ``pool`` row, as on 0.5.23
(``hooks/allocator.py``), with the same meaning (DESIGN.md §3).

Measured, not inferred: the outermost call into a leaf reads its available size before and
after and writes the difference as one ``alloc`` / ``free`` row (``alloc_fail`` when an
allocation returned None). In the fork a paged leaf has no ``_release_page_ids`` funnel and no
staged list: frees go through ``free`` (``torch.unique`` of the pages, prepended or put on
``release_pages``), allocations through ``alloc`` / ``alloc_extend`` / ``alloc_decode``, and the
available size is ``(len(free_pages) + len(release_pages)) * page_size`` (token leaf: without the
page factor). So the leaf's ``alloc``, ``alloc_extend``, ``alloc_decode``, ``free``, ``clear``
and ``restore_state`` are wrapped (exact parameters on the hot ones), ``merge_and_sort_free``
is a ``merge`` marker. A free inside a free group changes nothing (no row); the group's end
calls ``free`` and is measured then. The SWA composite (``swa_memory_pool.py``) is never
measured itself: its calls reach these leaves, tagged ``full`` / ``swa`` by its constructor.

Reads only CPU values (free-list ``numel()``); ``detail=pages`` is not supported here yet (no
page ids on fork rows).
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.sglang.hooks.allocator_common import (ALLOC, ALLOC_FAIL, CLEAR, FREE, FULL, MERGE,
                                                 Ledger, Types, emit)
from tracer.sglang.hooks.fork._contract import contracts
from tracer.sglang.patching import _subclasses, exact_only, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import after_init, run_measured, timed_before

MOD = "sglang.srt.mem_cache.allocator"
P_ALLOC = "(self, need_size)"
P_EXTEND = ("(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, "
            "extend_num_tokens, num_new_pages=None)")
P_DECODE = "(self, seq_lens, seq_lens_cpu, last_loc)"
P_FREE = "(self, free_index)"

_pools = ("full", "swa")
CONTRACTS = contracts(
    MOD,
    dict(hook="pool.device", cls="TokenToKVPoolAllocator", method="alloc", params=P_ALLOC,
         reads=("free_pages", "release_pages"), pools=_pools),
    dict(hook="pool.device", cls="TokenToKVPoolAllocator", method="free", params=P_FREE,
         reads=("free_pages", "release_pages", "is_not_in_free_group"), pools=_pools),
    dict(hook="pool.device", cls="PagedTokenToKVPoolAllocator", method="alloc",
         params=P_ALLOC, reads=("free_pages", "release_pages", "page_size"), pools=_pools),
    dict(hook="pool.device", cls="PagedTokenToKVPoolAllocator", method="alloc_extend",
         params=P_EXTEND, reads=("free_pages", "release_pages", "page_size"), pools=_pools),
    dict(hook="pool.device_decode", cls="PagedTokenToKVPoolAllocator", method="alloc_decode",
         params=P_DECODE, reads=("free_pages", "release_pages", "page_size"), pools=_pools),
    dict(hook="pool.device", cls="PagedTokenToKVPoolAllocator", method="free", params=P_FREE,
         reads=("free_pages", "release_pages", "page_size"), pools=_pools),
    dict(hook="pool.device", cls="PagedTokenToKVPoolAllocator", method="clear",
         reads=("free_pages", "release_pages"), pools=_pools),
    dict(hook="pool.device", cls="TokenToKVPoolAllocator", method="clear",
         reads=("free_pages", "release_pages"), pools=_pools),
    dict(hook="pool.device", cls="BaseTokenToKVPoolAllocator", method="merge_and_sort_free",
         reads=("release_pages",), optional=True),
    dict(hook="pool.device", cls="BaseTokenToKVPoolAllocator",
         method="restore_state", optional=True, pools=_pools),
)


class _Leaves:
    """The fork's exact leaf classes (their available size is read inline); set at install."""

    token: type | None = None
    paged: type | None = None


def _avail(a, d) -> int:
    """A leaf's ``available_size()`` from its ``__dict__`` (the fork's formulas); other
    subclasses call their own."""
    t = type(a)
    if t is _Leaves.paged:
        return (d["free_pages"].numel() + d["release_pages"].numel()) * d["page_size"]
    if t is _Leaves.token:
        return d["free_pages"].numel() + d["release_pages"].numel()
    return int(a.available_size())


def _pre(self):
    """Before a leaf op: the available size, with the leaf marked busy; None: run unmeasured
    (nested inside another measured op, or under construction)."""
    d = self.__dict__
    if d.get("_kvt_busy"):
        return None
    if tracer.pool is not S.emit_key:
        state.sync_recording()
    try:
        before = _avail(self, d)
    except Exception:
        return None
    d["_kvt_busy"] = True
    return before


def _post(self, before: int, dur: int, out, is_alloc: bool, name: str, need: int) -> None:
    d = self.__dict__
    d["_kvt_busy"] = False
    try:
        delta = before - _avail(self, d)
        pool = d.get("_kvt_pool", FULL)
        if pool is None:
            return
        if delta:
            S.dirty = True
            ps = d["page_size"]
            n = delta if delta > 0 else -delta
            if Ledger.depth:
                Ledger.net[pool] += delta
            tracer.pool(pool, ALLOC if delta > 0 else FREE, S.cur_rid, n, n // ps if ps > 1 else n,
                        dur)
        elif is_alloc and out is None:
            emit(pool, ALLOC_FAIL, need, d["page_size"], dur)
    except Exception as e:
        state.note_failure(f"fork.allocator.{name}", e)


def _make_alloc(orig):
    def alloc(self, need_size):
        if tracer.pool is NOOP:
            return orig(self, need_size)
        before = _pre(self)
        if before is None:
            return orig(self, need_size)
        out = None
        t0 = perf_counter_ns()
        try:
            out = orig(self, need_size)
            return out
        finally:
            _post(self, before, perf_counter_ns() - t0, out, True, "alloc", need_size)

    return alloc


def _make_extend(orig):
    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                     extend_num_tokens, num_new_pages=None):
        if tracer.pool is NOOP:
            return orig(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                        extend_num_tokens, num_new_pages)
        before = _pre(self)
        if before is None:
            return orig(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                        extend_num_tokens, num_new_pages)
        out = None
        t0 = perf_counter_ns()
        try:
            out = orig(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                       extend_num_tokens, num_new_pages)
            return out
        finally:
            _post(self, before, perf_counter_ns() - t0, out, True, "alloc_extend",
                  int(extend_num_tokens))

    return alloc_extend


def _make_decode(orig):
    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        if tracer.pool is NOOP:
            return orig(self, seq_lens, seq_lens_cpu, last_loc)
        before = _pre(self)
        if before is None:
            return orig(self, seq_lens, seq_lens_cpu, last_loc)
        out = None
        t0 = perf_counter_ns()
        try:
            out = orig(self, seq_lens, seq_lens_cpu, last_loc)
            return out
        finally:
            _post(self, before, perf_counter_ns() - t0, out, True, "alloc_decode",
                  len(seq_lens_cpu))

    return alloc_decode


def _make_free(orig):
    def free(self, free_index):
        if tracer.pool is NOOP:
            return orig(self, free_index)
        before = _pre(self)
        if before is None:
            return orig(self, free_index)
        t0 = perf_counter_ns()
        try:
            return orig(self, free_index)
        finally:
            _post(self, before, perf_counter_ns() - t0, True, False, "free", 0)

    return free


def _make_general(name: str):
    """``clear`` / ``restore_state``: measured like the others (a ``clear`` marker after the
    ``free`` a clear caused)."""

    def make(orig):
        def op(self, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, *args, **kwargs)
            d = self.__dict__
            if d.get("_kvt_busy"):
                return orig(self, *args, **kwargs)
            try:
                before = _avail(self, d)
            except Exception:  # under construction (free list not built yet)
                return orig(self, *args, **kwargs)

            def account(dur: int, out) -> None:
                pool = d.get("_kvt_pool", FULL)
                if pool is None:
                    return
                delta = before - _avail(self, d)
                ps = d["page_size"]
                if delta:
                    emit(pool, ALLOC if delta > 0 else FREE, abs(delta), ps, dur)
                if name == "clear" and delta < 0:
                    emit(pool, CLEAR, -delta, ps, 0)

            return run_measured(self, orig, args, kwargs, account, f"fork.allocator.{name}")

        return op

    return make


def _staged(a, args, kwargs):
    """Slots on a leaf's release list before ``merge_and_sort_free`` (None: no row)."""
    d = a.__dict__
    rel = d.get("release_pages")
    n = int(rel.numel()) if rel is not None else 0
    return n * d.get("page_size", 1) if n else None


def _account_merge(a, staged: int, dur_ns: int, args, kwargs) -> None:
    pool = a.__dict__.get("_kvt_pool", FULL)
    if pool is not None:
        emit(pool, MERGE, staged, a.page_size, dur_ns)


def _leaf_init(self) -> None:
    if state.registry.allocator is None:
        state.registry.allocator = self
    state.touch("allocator")


_HOT = {"alloc": (P_ALLOC, _make_alloc), "alloc_extend": (P_EXTEND, _make_extend),
        "alloc_decode": (P_DECODE, _make_decode), "free": (P_FREE, _make_free)}


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the fork's allocator leaves (``counts``/``pages``). Returns the number wrapped now.

    Mutates: the leaf classes (through ``patcher``), ``Types.leaf`` / ``Types.fast`` (emptied:
    the 0.5.23 inline formulas do not apply to the fork's leaves).
    """
    if level == "steps":
        return 0
    mod = target(MOD, lazy)
    if mod is None:
        return 0
    Token, Paged = mod.TokenToKVPoolAllocator, mod.PagedTokenToKVPoolAllocator
    _Leaves.token, _Leaves.paged = Token, Paged
    Types.leaf, Types.fast = (Token, Paged), frozenset()
    n = 0
    for leaf in (Token, Paged):
        for cls in _subclasses(leaf):  # (subclasses that override a method are leaves too)
            for name, (params, make) in _HOT.items():
                if name in cls.__dict__:
                    n += patcher.wrap_method(cls, name, exact_only(params, make))
            for name in ("clear", "restore_state"):
                if cls is leaf:
                    n += patcher.wrap_inherited(cls, name, _make_general(name))
                else:
                    n += patcher.wrap_method(cls, name, _make_general(name))
        n += patcher.wrap_inherited(leaf, "merge_and_sort_free",
                                    timed_before("fork.allocator.merge", _staged, _account_merge))
        n += patcher.wrap_method(leaf, "__init__", after_init("fork.allocator.init", _leaf_init))
    return n
