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

``ReqToTokenPool`` rows are in ``req_pool.py``.

Reads only CPU-side values: free-list tensor shapes and Python counters. Page ids
(``detail="pages"``) are the one exception and cost a device sync per op.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.schema import Pool, PoolOp
from tracer.sglang import state
from tracer.sglang.page_ids import alloc_page_ids as _alloc_page_ids
from tracer.sglang.page_ids import capture_inner as _capture_inner
from tracer.sglang.page_ids import ids_numpy as _ids_numpy
from tracer.sglang.patching import exact, exact_only

_NOOP = state._NOOP
FULL, SWA = int(Pool.FULL), int(Pool.SWA)
ALLOC, FREE, ALLOC_FAIL = int(PoolOp.ALLOC), int(PoolOp.FREE), int(PoolOp.ALLOC_FAIL)
GROUP_BEGIN, GROUP_END = int(PoolOp.FREE_GROUP_BEGIN), int(PoolOp.FREE_GROUP_END)
MERGE, CLEAR = int(PoolOp.MERGE), int(PoolOp.CLEAR)

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

_leaf_types: tuple[type, ...] = ()
_swa_types: tuple[type, ...] = ()
_fast_types: frozenset = frozenset()  # leaf classes whose available_size() is the base formula
# type -> is a leaf / an SWA composite (isinstance on these ABCs costs ~1 us: cached per type)
_is_swa: dict[type, bool] = {}
_pm: list = [None, False]  # (recorder, detail == "pages")
# Rows written inside a measured outer call (``measure_decode``): [depth, net slots per pool
# (alloc +, free -)], so the outer call writes only what they do not explain.
_led: list = [0, [0] * 8]


def _swa(obj) -> bool:
    t = type(obj)
    r = _is_swa.get(t)
    if r is None:
        r = _is_swa[t] = isinstance(obj, _swa_types)
    return r


def _available(a) -> int:
    """``a.available_size()`` without ``Tensor.__len__`` (a Python-level call): the free list's
    ``shape[0]`` plus the staged/release count, the formula of the token and paged allocators.
    Subclasses that override ``available_size`` use their own."""
    if type(a) not in _fast_types:
        return a.available_size()
    d = a.__dict__
    staged = d.get("num_staged_pages")
    if staged is not None:  # paged
        return (d["free_pages"].numel() + staged) * d["page_size"]
    return d["free_pages"].numel() + d["release_pages"].numel()


def _pages_mode() -> bool:
    rec = tracer._active
    if rec is not _pm[0]:
        _pm[0], _pm[1] = rec, rec is not None and rec.opts.detail == "pages"
    return _pm[1]


def _emit(pool: int, op: int, n: int, ps: int, dur_ns: int, ids=None) -> None:
    state.dirty[0] = True
    if _led[0] and op <= FREE:  # (ALLOC 0, FREE 1)
        _led[1][pool] += n if op == ALLOC else -n
    if ids is None:
        tracer.pool(pool, op, state.cur_rid[0], n, n // ps if ps > 1 else n, dur_ns)
    else:
        tracer.pool_ids(pool, op, state.cur_rid[0], n, n // ps if ps > 1 else n, dur_ns, ids)


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
    delta = before - _available(a)
    if delta > 0:
        ids = _alloc_page_ids(a, name, fp0, delta // ps, out) if fp0 is not None else None
        _emit(pool, ALLOC, delta, ps, dur_ns, ids)
    elif delta < 0:
        _emit(pool, FREE, -delta, ps, dur_ns, _ids_numpy(cap) if cap is not None else None)
    elif kind == "alloc" and out is None:
        _emit(pool, ALLOC_FAIL, _requested_slots(name, args, kwargs), ps, dur_ns)
    if kind == "clear" and delta < 0:
        _emit(pool, CLEAR, -delta, ps, 0)


_GENERAL = object()  # _leaf_pre: measure through _general


def _leaf_pre(self, simple: bool, name: str, args):
    """Start measuring a leaf op: None (run it unmeasured: nested or under construction),
    ``_GENERAL`` (the general path) or ``(before, staged)`` with the leaf marked busy."""
    d = self.__dict__
    if d.get("_kvt_busy"):
        if "_kvt_cap" in d:  # detail=pages: collect the ids actually released
            _capture_inner(self, name, args, d["_kvt_cap"])
        return None
    if tracer._active is not _pm[0]:
        _pages_mode()
    if not simple or _pm[1] or type(self) not in _fast_types:
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
                state.dirty[0] = True
                ps = d["page_size"]
                n = delta if delta > 0 else -delta
                if _led[0]:
                    _led[1][pool] += delta
                tracer.pool(pool, ALLOC if delta > 0 else FREE, state.cur_rid[0], n, n // ps, dur)
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
            if tracer.pool is _NOOP:
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
            if tracer.pool is _NOOP:
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
        _emit(pool, ALLOC, delta, ps, dur_ns)
    elif delta < 0:
        _emit(pool, FREE, -delta, ps, dur_ns)
    else:
        _emit(pool, ALLOC_FAIL, _requested_slots(name, args, kwargs), ps, dur_ns)


def _general(self, orig, kind: str, name: str, args, kwargs):
    """Every other case: group ends (markers), clears, detail=pages, other leaf subclasses."""
    d = self.__dict__
    group = kind == "group_end"
    pool = d.get("_kvt_pool", FULL)
    if group:
        if not (d.get("free_group") or d.get("free_page_ids_group")):
            return orig(self, *args, **kwargs)  # an empty group releases nothing
        if pool is not None:
            _emit(pool, GROUP_BEGIN, 0, d["page_size"], 0)
    try:
        before = _available(self)
    except Exception:  # under construction (free list not built yet)
        return orig(self, *args, **kwargs)
    fp0 = cap = None
    if _pm[1]:
        fp0 = d.get("free_pages") if kind == "alloc" else None
        cap = d["_kvt_cap"] = []
        _capture_inner(self, name, args, cap)

    def account(dur: int, out) -> None:
        if cap is not None:
            d.pop("_kvt_cap", None)
        _account(self, kind, name, before, dur, args, kwargs, out, fp0, cap)
        if group and pool is not None:
            _emit(pool, GROUP_END, 0, d["page_size"], 0)

    return state.run_measured(self, orig, args, kwargs, account, f"allocator.{name}")


def _make_merge():
    def make(orig):
        def merge(self, *args, **kwargs):
            if tracer.pool is _NOOP:
                return orig(self, *args, **kwargs)
            try:
                staged = _staged_slots(self)
            except Exception:
                staged = 0
            t0 = perf_counter_ns()
            out = orig(self, *args, **kwargs)
            if staged > 0:
                try:
                    pool = self.__dict__.get("_kvt_pool", FULL)
                    if pool is not None:
                        _emit(pool, MERGE, staged, self.page_size, perf_counter_ns() - t0)
                except Exception as e:
                    state.note_failure("allocator.merge", e)
            return out

        return merge

    return make


# ------------------------------------------------------------------ decode allocation
def _leaves(a) -> tuple:
    """``((leaf, pool, leaf.__dict__ or None), ...)`` of a top-level allocator: the SWA
    composite's two leaves, or the allocator itself (the ``__dict__`` when the leaf's available
    size is the token/paged formula, read inline). Cached on it (``_kvt_leaves``; ``tag_swa``
    resets it)."""
    d = a.__dict__
    lv = d.get("_kvt_leaves")
    if lv is None:
        if _swa_types and _swa(a):
            tag_swa(a)
            cands = (d.get("full_attn_allocator"), d.get("swa_attn_allocator"))
        else:
            cands = (a,)
        out = []
        for leaf in cands:
            if leaf is None or any(leaf is x[0] for x in out):
                continue
            pool = leaf.__dict__.get("_kvt_pool", FULL)
            if pool is not None:
                out.append((leaf, pool, leaf.__dict__ if type(leaf) in _fast_types else None))
        lv = d["_kvt_leaves"] = tuple(out)
    return lv


def _decode_ids(batch, a, pool: int):
    """detail=pages: the pages a decode step took, from the slots it returned (a page is new
    where its first slot was handed out); the SWA side through the full->SWA mapping."""
    loc = batch.out_cache_loc
    if loc is None:
        return None
    ps = a.page_size
    if pool == SWA and _swa(a):
        loc = a.translate_loc_from_full_to_swa(loc)
    return _ids_numpy([loc[loc % ps == 0] // ps])


def measure_decode(batch, orig):
    """Run ``orig(batch)`` (``ScheduleBatch.prepare_for_decode``) and write one ``alloc`` row per
    pool for the decode allocation: the leaves' change of available size minus what the rows
    written inside explain (evictions, out-of-window releases). Returns what ``orig`` returns.
    (Runs at every decode step: the leaves' sizes are read inline.)
    """
    led = _led
    if led[0]:
        return orig(batch)
    try:
        a = batch.token_to_kv_pool_allocator
        lv = a.__dict__.get("_kvt_leaves") or _leaves(a)
        before = []
        for leaf, _, d in lv:
            if d is None:
                before.append(leaf.available_size())
            elif (st := d.get("num_staged_pages")) is not None:
                before.append((d["free_pages"].numel() + st) * d["page_size"])
            else:
                before.append(d["free_pages"].numel() + d["release_pages"].numel())
    except Exception:
        return orig(batch)
    led[0], led[1] = 1, [0] * 8
    t0 = perf_counter_ns()
    out = None
    try:
        out = orig(batch)
        return out
    finally:
        dur = perf_counter_ns() - t0
        led[0] = 0
        try:
            net = led[1]
            for (leaf, pool, d), b in zip(lv, before):
                if d is None:
                    n = b - leaf.available_size() - net[pool]
                elif (st := d.get("num_staged_pages")) is not None:
                    n = b - (d["free_pages"].numel() + st) * d["page_size"] - net[pool]
                else:
                    n = b - d["free_pages"].numel() - d["release_pages"].numel() - net[pool]
                if n:
                    _decode_row(batch, a, leaf, pool, n, dur)
        except Exception as e:
            state.note_failure("allocator.decode", e)


def _decode_row(batch, a, leaf, pool: int, n: int, dur: int) -> None:
    ps = leaf.page_size
    state.dirty[0] = True
    op = ALLOC if n > 0 else FREE
    n = n if n > 0 else -n
    if _pm[1] and op == ALLOC:
        tracer.pool_ids(pool, op, state.cur_rid[0], n, n // ps if ps > 1 else n, dur,
                        _decode_ids(batch, a, pool))
    else:
        tracer.pool(pool, op, state.cur_rid[0], n, n // ps if ps > 1 else n, dur)


# ------------------------------------------------------------------ SWA composite
def tag_swa(a) -> None:
    """Tag the leaves of an SWA allocator with their pools (idempotent; no-op for others).

    Mutates: ``a.full_attn_allocator._kvt_pool``, ``a.swa_attn_allocator._kvt_pool`` and
    ``a._kvt_tagged``.
    """
    d = a.__dict__
    if "_kvt_tagged" in d or not _swa_types or not _swa(a):
        return
    d.pop("_kvt_leaves", None)
    full, swa = d.get("full_attn_allocator"), d.get("swa_attn_allocator")
    if swa is not None:
        # ring mode: SWA slots are per request slot, not paged from this leaf
        swa.__dict__["_kvt_pool"] = None if getattr(a, "_swa_req_ring", False) and swa is not full \
            else SWA
    if full is not None and full is not swa:
        full.__dict__["_kvt_pool"] = FULL
    d["_kvt_tagged"] = True


def _make_swa_init():
    def make(orig):
        def init(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            try:
                self.__dict__.pop("_kvt_tagged", None)  # a subclass may rebuild its leaves
                tag_swa(self)
                state.registry.allocator = self
                state.touch("allocator")
            except Exception as e:
                state.note_failure("allocator.swa_init", e)

        return init

    return make


def _make_swa_group_end():
    """Markers around a group's release, for each pool that had deferred frees: the full leaf's
    own group and the SWA side the composite defers itself. The release rows in between come
    from the leaves' ``_release_page_ids`` / ``free`` hooks like any other free. Most groups
    (most decode steps) deferred nothing: that check is the whole cost."""

    def make(orig):
        def free_group_end(self):
            d = self.__dict__
            if tracer.pool is _NOOP:
                return orig(self)
            full = d.get("full_attn_allocator")
            fd = full.__dict__ if full is not None else {}
            full_pending = fd.get("free_group") or fd.get("free_page_ids_group")
            swa_pending = d.get("swa_page_ids_group") or d.get("swa_free_group")
            if not (full_pending or swa_pending):
                return orig(self)
            try:
                swa = d.get("swa_attn_allocator")
                tag_swa(self)
                pools = []
                if full_pending:
                    pools.append(fd.get("_kvt_pool", FULL))
                if swa_pending and swa is not None and swa is not full:
                    pools.append(swa.__dict__.get("_kvt_pool", SWA))
                pools = [p for p in pools if p is not None]
                ps = self.page_size
                for p in pools:
                    _emit(p, GROUP_BEGIN, 0, ps, 0)
            except Exception as e:
                state.note_failure("allocator.swa_group_end", e)
                return orig(self)
            try:
                return orig(self)
            finally:
                try:
                    for p in pools:
                        _emit(p, GROUP_END, 0, ps, 0)
                except Exception as e:
                    state.note_failure("allocator.swa_group_end", e)

        return free_group_end

    return make


def _make_leaf_init():
    def make(orig):
        def init(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            try:
                if state.registry.allocator is None:
                    state.registry.allocator = self
                state.touch("allocator")
            except Exception as e:
                state.note_failure("allocator.init", e)

        return init

    return make


# ------------------------------------------------------------------ install
def install(patcher, lazy: bool = False) -> int:
    """Wrap the allocator classes. Returns the number of methods wrapped now.

    Args:
        patcher: the ``Patcher`` recording every patch.
        lazy: only wrap modules already imported (autoload); else import them.
    Mutates: the sglang allocator classes (through ``patcher``) and this module's type caches.
    """
    global _leaf_types, _swa_types, _fast_types
    from tracer.sglang.patching import target

    base = target("sglang.srt.mem_cache.allocator.base", lazy)
    paged = target("sglang.srt.mem_cache.allocator.paged", lazy)
    token = target("sglang.srt.mem_cache.allocator.token", lazy)
    n = 0
    if base is not None and paged is not None and token is not None:
        Token, Paged = token.TokenToKVPoolAllocator, paged.PagedTokenToKVPoolAllocator
        _leaf_types = (Token, Paged)
        _fast_types = frozenset((Token, Paged))
        # Wrapped on the leaf classes only (inherited base methods are added to each leaf), so
        # the SWA composite's calls into the base class run unwrapped.
        from tracer.sglang.patching import _subclasses

        for name, kind in LEAF_METHODS.items():
            for leaf in _leaf_types:
                if hasattr(leaf, name) and (leaf is not Paged or name in PAGED_METHODS):
                    n += patcher.wrap_inherited(leaf, name, _make_leaf(kind, name))
                # Subclasses that override (e.g. the NPU paged allocator) are leaves too.
                for sub in _subclasses(leaf)[1:]:
                    n += patcher.wrap_method(sub, name, _make_leaf(kind, name))
        for leaf in _leaf_types:
            n += patcher.wrap_inherited(leaf, "merge_and_sort_free", _make_merge())
            n += patcher.wrap_method(leaf, "__init__", _make_leaf_init())
    swa = target("sglang.srt.mem_cache.allocator.swa", lazy)
    if swa is not None:
        S = swa.SWATokenToKVPoolAllocator
        _swa_types = (S,)
        _is_swa.clear()
        # PureSWA and other SWA subclasses have their own constructors: tag after each
        n += patcher.wrap_method_tree(S, "__init__", _make_swa_init())
        n += patcher.wrap_method(S, "free_group_end", exact_only("(self)", _make_swa_group_end()))
    return n
