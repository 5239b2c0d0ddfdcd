"""Hooks on sglang's device allocators: every change of a pool's free list becomes a ``pool`` row.

Occupancy is measured, not inferred: the outermost call into a *leaf* allocator
(``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``, the classes that own a free list)
reads the available size before and after and records the difference as one ``alloc`` or ``free``
row. Whatever path the server takes (``free``, ``free_segment(s)``, ``free_full_segment(s)``,
``free_page_ids``, a free group's release, ``alloc_extend``...), the rows of a pool sum to its
``capacity - available``. Nested calls (``free_segment`` -> ``free_page_ids`` ->
``_release_page_ids``) are not counted again.

The SWA allocator (``SWATokenToKVPoolAllocator``) is a composite of two leaves of the same class;
it is never measured itself, so nothing is counted twice. Its constructor tags its leaves
(``full`` / ``swa`` pool); a leaf that was never tagged (an allocator built before ``install``)
counts as ``full`` until the stats sampler or the tree adopts its composite and tags it.

Free groups: a free inside a group changes nothing and leaves no row; the group's release at
``free_group_end`` reaches the leaves' ``free`` / ``_release_page_ids`` and is measured like any
other free. On the SWA composite (the hybrid models this toolkit is about), a group that released
something is framed by ``free_group_begin`` / ``free_group_end`` marker rows, per pool, around its
release rows; empty groups (most decode steps) leave no rows. A plain allocator's group release
shows as free rows without markers (wrapping every leaf's group end would cost a call per group
on the hot path of SWA models too).

Fewest wrapped calls on the hot path (each costs about a microsecond in the scheduler loop):

- every free of the paged leaf reaches the free list through ``_release_page_ids`` (``free``,
  ``free_page_ids``, ``free_segment(s)``, ``free_full*``, group ends), so on
  ``PagedTokenToKVPoolAllocator`` itself only that funnel, the allocations and ``clear`` /
  ``resize`` are wrapped (subclasses that override any leaf method are wrapped there too);
- decode allocation (``alloc_decode``, two leaf calls per decode step on SWA models) is not
  wrapped: ``measure_decode`` reads the leaves around ``ScheduleBatch.prepare_for_decode`` (its
  only caller in 0.5.23, through ``alloc_for_decode``) and writes one ``alloc`` row per pool for
  what the rows written inside (evictions, out-of-window frees) do not explain. Those rows carry
  the duration of ``prepare_for_decode``.

``ReqToTokenPool`` rows are in ``memory_pool.py``; the SWA composite's hooks in
``allocator_swa.py``, the decode measurement in ``allocator_decode.py``.

Reads only CPU-side values: free-list tensor shapes and Python counters. Page ids
(``detail="pages"``) are the one exception and cost a device sync per op.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.sglang.hooks import allocator_swa
from tracer.sglang.hooks.allocator_common import (ALLOC, ALLOC_FAIL, CLEAR, FREE, FULL, GROUP_BEGIN,
                                                 GROUP_END, MERGE, Ledger, Types, available, emit)
from tracer.sglang.hooks.page_ids import alloc_page_ids, capture_inner, ids_numpy
from tracer.sglang.patching import _subclasses, exact, target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import after_init, run_measured, timed_before
from tracer.sglang.targets.contract import Contract

# Methods of the leaf allocators (and their base) that may change occupancy, by kind.
LEAF_METHODS: dict[str, str] = {
    "alloc": "alloc",
    "alloc_extend": "alloc",
    "free": "free",
    "free_page_ids": "free",
    "free_segment": "free",
    "free_segments": "free",
    "free_full": "free",
    "free_full_segment": "free",
    "free_full_segments": "free",
    "_release_page_ids": "free",
    "clear": "clear",
    "resize": "clear",
}
# On the paged leaf class itself: the funnel every free passes through, allocations, clears.
PAGED_METHODS = ("alloc", "alloc_extend", "_release_page_ids", "clear", "resize")


_TOKEN, _PAGED = "sglang.srt.mem_cache.allocator.token", "sglang.srt.mem_cache.allocator.paged"
_TOKEN_READS, _PAGED_READS = ("free_pages", "release_pages"), ("free_pages", "num_staged_pages",
                                                                "page_size")
# What these hooks need of the code (tracer.sglang.targets; checked at install, docs/capture.md).
CONTRACTS: tuple[Contract, ...] = tuple(
    Contract("pool.device", mod, cls, name, reads=reads)
    for mod, cls, reads, names in (
        (_TOKEN, "TokenToKVPoolAllocator", _TOKEN_READS, ("__init__", "alloc", "free", "clear")),
        (_PAGED, "PagedTokenToKVPoolAllocator", _PAGED_READS,
         ("__init__", "alloc", "alloc_extend", "_release_page_ids", "clear")))
    for name in names
) + (
    Contract("pool.device", _PAGED, "PagedTokenToKVPoolAllocator", "merge_and_sort_free",
             optional=True),
) + allocator_swa.CONTRACTS


def _requested_slots(name: str, args, kwargs) -> int:
    """Slots an allocation asked for (for ``alloc_fail`` rows)."""
    try:
        if name == "alloc":
            return int(kwargs.get("need_size", args[0] if args else 0))
        if name == "alloc_extend":
            return int(kwargs.get("extend_num_tokens", args[5] if len(args) > 5 else 0))
        if name == "alloc_decode":
            return len(kwargs.get("seq_lens_cpu", args[1] if len(args) > 1 else ()))
    except Exception:
        pass
    return 0


def _staged_slots(a) -> int:
    """Slots waiting in a leaf's release/staged list (merged by ``merge_and_sort_free``)."""
    n = a.__dict__.get("num_staged_pages")
    if n is not None:
        return int(n) * a.page_size
    rel = a.__dict__.get("release_pages")
    return len(rel) if rel is not None else 0


# ------------------------------------------------------------------ leaf wrapper
def _account(a, kind: str, name: str, before: int, dur_ns: int, args, kwargs, out, fp0, cap):
    pool = a.__dict__.get("_kvt_pool", FULL)
    if pool is None:
        return
    ps = a.page_size
    delta = before - available(a)
    if delta > 0:
        ids = alloc_page_ids(a, name, fp0, delta // ps, out) if fp0 is not None else None
        emit(pool, ALLOC, delta, ps, dur_ns, ids)
    elif delta < 0:
        emit(pool, FREE, -delta, ps, dur_ns, ids_numpy(cap) if cap is not None else None)
    elif kind == "alloc" and out is None:
        emit(pool, ALLOC_FAIL, _requested_slots(name, args, kwargs), ps, dur_ns)
    if kind == "clear" and delta < 0:
        emit(pool, CLEAR, -delta, ps, 0)


_GENERAL = object()  # _leaf_pre: measure through _general


def _leaf_pre(self, simple: bool, name: str, args):
    """Start measuring a leaf op: None (run it unmeasured: nested or under construction),
    ``_GENERAL`` (the general path) or ``(before, staged)`` with the leaf marked busy."""
    d = self.__dict__
    if d.get("_kvt_busy"):
        if "_kvt_cap" in d:  # detail=pages: collect the ids actually released
            capture_inner(self, name, args, d["_kvt_cap"])
        return None
    if tracer.pool is not S.emit_key:
        state.sync_recording()
    if not simple or S.pages or type(self) not in Types.fast:
        return _GENERAL
    try:
        staged = d.get("num_staged_pages")  # numel(): the cheapest size of a 1-D tensor
        if staged is None:
            before = d["free_pages"].numel() + d["release_pages"].numel()
        else:
            before = (d["free_pages"].numel() + staged) * d["page_size"]
    except Exception:  # under construction (free list not built yet)
        return None
    d["_kvt_busy"] = True
    return before, staged


def _leaf_post(self, pre, dur: int, out, kind: str, name: str, args, kwargs) -> None:
    """Finish ``_leaf_pre``: one ``alloc``/``free`` row for the change of available size (an
    ``alloc_fail`` row for a failed allocation)."""
    d = self.__dict__
    d["_kvt_busy"] = False
    before, staged = pre
    try:
        fp = d["free_pages"]
        if staged is None:
            delta = before - fp.numel() - d["release_pages"].numel()
        else:
            delta = before - (fp.numel() + d["num_staged_pages"]) * d["page_size"]
        if delta:
            pool = d.get("_kvt_pool", FULL)
            if pool is not None:
                S.dirty = True
                ps = d["page_size"]
                n = delta if delta > 0 else -delta
                if Ledger.depth:
                    Ledger.net[pool] += delta
                tracer.pool(pool, ALLOC if delta > 0 else FREE, S.cur_rid, n, n // ps, dur)
        elif out is None and kind == "alloc":
            _account_delta(self, kind, name, delta, dur, args, kwargs)
    except Exception as e:
        state.note_failure(f"allocator.{name}", e)


def _make_leaf(kind: str, name: str):
    """Wrapper factory for one leaf method. The common case (counts detail, token/paged leaf,
    not a group end or clear) is measured by ``_leaf_pre``/``_leaf_post``; ``_release_page_ids``
    (every paged free) forwards its usual single argument with an exact call."""
    simple = kind in ("alloc", "free")

    def generic(orig):
        def leaf_op(self, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, *args, **kwargs)
            pre = _leaf_pre(self, simple, name, args)
            if pre is None:
                return orig(self, *args, **kwargs)
            if pre is _GENERAL:
                return _general(self, orig, kind, name, args, kwargs)
            out = None
            t0 = perf_counter_ns()
            try:
                out = orig(self, *args, **kwargs)
                return out
            finally:
                _leaf_post(self, pre, perf_counter_ns() - t0, out, kind, name, args, kwargs)

        return leaf_op

    def release(orig):
        def _release_page_ids(self, *page_ids):
            if tracer.pool is NOOP:
                return orig(self, *page_ids)
            pre = _leaf_pre(self, True, name, page_ids)
            if pre is None:
                return orig(self, *page_ids)
            if pre is _GENERAL:
                return _general(self, orig, kind, name, page_ids, {})
            t0 = perf_counter_ns()
            try:
                return orig(self, page_ids[0]) if len(page_ids) == 1 else orig(self, *page_ids)
            finally:
                _leaf_post(self, pre, perf_counter_ns() - t0, True, kind, name, page_ids, None)

        return _release_page_ids

    if name == "_release_page_ids":
        return exact("(self, *page_ids)", release, generic)
    return generic


def _account_delta(a, kind: str, name: str, delta: int, dur_ns: int, args, kwargs) -> None:
    pool = a.__dict__.get("_kvt_pool", FULL)
    if pool is None:
        return
    ps = a.page_size
    if delta > 0:
        emit(pool, ALLOC, delta, ps, dur_ns)
    elif delta < 0:
        emit(pool, FREE, -delta, ps, dur_ns)
    else:
        emit(pool, ALLOC_FAIL, _requested_slots(name, args, kwargs), ps, dur_ns)


def _general(self, orig, kind: str, name: str, args, kwargs):
    """Every other case: group ends (markers), clears, detail=pages, other leaf subclasses."""
    d = self.__dict__
    group = kind == "group_end"
    pool = d.get("_kvt_pool", FULL)
    if group:
        if not (d.get("free_group") or d.get("free_page_ids_group")):
            return orig(self, *args, **kwargs)  # an empty group releases nothing
        if pool is not None:
            emit(pool, GROUP_BEGIN, 0, d["page_size"], 0)
    try:
        before = available(self)
    except Exception:  # under construction (free list not built yet)
        return orig(self, *args, **kwargs)
    fp0 = cap = None
    if S.pages:
        fp0 = d.get("free_pages") if kind == "alloc" else None
        cap = d["_kvt_cap"] = []
        capture_inner(self, name, args, cap)

    def account(dur: int, out) -> None:
        if cap is not None:
            d.pop("_kvt_cap", None)
        _account(self, kind, name, before, dur, args, kwargs, out, fp0, cap)
        if group and pool is not None:
            emit(pool, GROUP_END, 0, d["page_size"], 0)

    return run_measured(self, orig, args, kwargs, account, f"allocator.{name}")


def _staged_or_none(a, args, kwargs):
    staged = _staged_slots(a)
    return staged if staged > 0 else None


def _account_merge(a, staged: int, dur_ns: int, args, kwargs) -> None:
    """``merge_and_sort_free``: a ``merge`` marker with the slots it moved to the free list."""
    pool = a.__dict__.get("_kvt_pool", FULL)
    if pool is not None:
        emit(pool, MERGE, staged, a.page_size, dur_ns)


def _leaf_init(self) -> None:
    if state.registry.allocator is None:
        state.registry.allocator = self
    state.touch("allocator")


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap the allocator classes (``counts``/``pages`` only). Returns the number wrapped now.

    Args:
        patcher: the ``Patcher`` recording every patch.
        lazy: only wrap modules already imported (autoload); else import them.
        level: capture level (``steps`` wraps nothing here).
    Mutates: the sglang allocator classes (through ``patcher``) and ``Types``.
    """
    if level == "steps":
        return 0
    base = target("sglang.srt.mem_cache.allocator.base", lazy)
    paged = target("sglang.srt.mem_cache.allocator.paged", lazy)
    token = target("sglang.srt.mem_cache.allocator.token", lazy)
    n = 0
    if base is not None and paged is not None and token is not None:
        Token, Paged = token.TokenToKVPoolAllocator, paged.PagedTokenToKVPoolAllocator
        Types.leaf = (Token, Paged)
        Types.fast = frozenset((Token, Paged))
        # Wrapped on the leaf classes only (inherited base methods are added to each leaf), so
        # the SWA composite's calls into the base class run unwrapped.
        for name, kind in LEAF_METHODS.items():
            for leaf in Types.leaf:
                if hasattr(leaf, name) and (leaf is not Paged or name in PAGED_METHODS):
                    n += patcher.wrap_inherited(leaf, name, _make_leaf(kind, name))
                # Subclasses that override (e.g. the NPU paged allocator) are leaves too.
                for sub in _subclasses(leaf)[1:]:
                    n += patcher.wrap_method(sub, name, _make_leaf(kind, name))
        for leaf in Types.leaf:
            n += patcher.wrap_inherited(leaf, "merge_and_sort_free", timed_before("allocator.merge", _staged_or_none, _account_merge))
            n += patcher.wrap_method(leaf, "__init__", after_init("allocator.init", _leaf_init))
    swa = target("sglang.srt.mem_cache.allocator.swa", lazy)
    if swa is not None:
        n += allocator_swa.install(patcher, swa)
    return n
