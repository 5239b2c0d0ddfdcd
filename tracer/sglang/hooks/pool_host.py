"""Hooks on HiCache host pools (``sglang.srt.mem_cache.pool_host``: ``HostKVCache`` and its
subclasses, ``HostPoolGroup``; ``memory_pool_host.LogicalHostPool``): alloc, free (lazy release)
and merge, each with ``dur_ns``.

A host pool (``HostKVCache`` and subclasses, ``LogicalHostPool``) counts released-but-unmerged
slots as available, so a free is recorded when it is queued (DESIGN.md §3). Like the device
allocators, the outermost ``alloc``/``free``/``clear`` call measures ``available_size()`` before
and after, under the pool's own re-entrant lock so that a concurrent thread cannot slip in between.
``_merge_release_slots`` (the concatenation that #30658 made lazy) is a ``merge`` marker whose
``dur_ns`` is the CPU cost of that concatenation.

Pools are tagged by their entry in a ``HostPoolGroup``: ``kv`` -> ``host_full``, ``swa`` ->
``host_swa``; other side pools (mamba, indexer, ...) are not recorded. An ungrouped pool counts as
``host_full``.

At ``steps`` only the constructors and the group's tagging are wrapped (the sampler's registry).
"""

from __future__ import annotations

import tracer
from tracer.schema import Pool, PoolOp
from tracer.sglang.patching import target
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import NOOP, S
from tracer.sglang.wrappers import after_call, after_init, run_measured, timed_before
from tracer.sglang.targets.contract import LEVELS, Contract

HOST_FULL, HOST_SWA = int(Pool.HOST_FULL), int(Pool.HOST_SWA)
ALLOC, FREE, ALLOC_FAIL = int(PoolOp.ALLOC), int(PoolOp.FREE), int(PoolOp.ALLOC_FAIL)
MERGE, CLEAR = int(PoolOp.MERGE), int(PoolOp.CLEAR)


_HB, _GRP = "sglang.srt.mem_cache.pool_host.base", "sglang.srt.mem_cache.pool_host.group"
_MPH = "sglang.srt.mem_cache.memory_pool_host"
CONTRACTS: tuple[Contract, ...] = tuple(
    Contract("pool.host", mod, cls, name, reads=("lock",) if name != "__init__" else (),
             levels=LEVELS if name == "__init__" else ("counts", "pages"))
    for mod, cls in ((_HB, "HostKVCache"), (_MPH, "LogicalHostPool"))
    for name in ("__init__", "alloc", "free", "clear", "_merge_release_slots")
) + (
    Contract("pool.host_group", _GRP, "HostPoolGroup", "__init__", reads=("entries",),
             levels=LEVELS),
    Contract("pool.host_group", _GRP, "HostPoolGroup", "add_entry", levels=LEVELS),
)


def _page_size(p) -> int:
    return int(getattr(p, "page_size", 1) or 1)


def _ids(t, ps: int):
    import numpy as np

    try:
        a = t.reshape(-1).cpu().numpy()
        return (a[::ps] // ps).astype(np.int32) if ps > 1 else a.astype(np.int32)
    except Exception:
        return None


def emit(pool: int, op: int, n: int, ps: int, dur_ns: int, ids=None) -> None:
    pages = n // ps if ps > 1 else n
    S.dirty = True
    if ids is None:
        tracer.pool(pool, op, S.cur_rid, n, pages, dur_ns)
    else:
        tracer.pool_ids(pool, op, S.cur_rid, n, pages, dur_ns, ids)


def _make_op(name: str):
    def make(orig):
        def host_op(self, *args, **kwargs):
            if tracer.pool is NOOP:
                return orig(self, *args, **kwargs)
            d = self.__dict__
            pool = d.get("_kvt_pool", HOST_FULL)
            lock = d.get("lock")
            if pool is None or lock is None or d.get("_kvt_busy"):
                return orig(self, *args, **kwargs)
            with lock:
                try:
                    before = self.available_size()
                except Exception:
                    return orig(self, *args, **kwargs)
                return run_measured(
                    self, orig, args, kwargs,
                    lambda dur, out: _account(self, pool, name, before, dur, args, kwargs, out),
                    f"host_pool.{name}")

        return host_op

    return make


def _account(p, pool: int, name: str, before: int, dur_ns: int, args, kwargs, out) -> None:
    delta = before - p.available_size()
    ps = _page_size(p)
    state.recorder()
    pages = S.pages
    if delta > 0:
        emit(pool, ALLOC, delta, ps, dur_ns, _ids(out, ps) if pages and out is not None else None)
    elif delta < 0:
        ids = _ids(args[0], ps) if pages and name == "free" and args else None
        emit(pool, FREE, -delta, ps, dur_ns, ids)
    elif name == "alloc" and out is None:
        need = kwargs.get("need_size", args[0] if args else 0)
        emit(pool, ALLOC_FAIL, int(need), ps, dur_ns)
    if name == "clear" and delta < 0:
        emit(pool, CLEAR, -delta, ps, 0)


def _staged(p, args, kwargs):
    """(pool, released slots waiting to be merged) before ``_merge_release_slots``; None: no row."""
    pool = p.__dict__.get("_kvt_pool", HOST_FULL)
    staged = int(p.__dict__.get("num_release_slots", 0) or 0)
    return (pool, staged) if staged and pool is not None else None


def _account_merge(p, pre, dur_ns: int, args, kwargs) -> None:
    emit(pre[0], MERGE, pre[1], _page_size(p), dur_ns)


def _register(p) -> None:
    state.registry.host_pools[id(p)] = p
    state.touch("host_pool")


def tag_group(group) -> None:
    """Tag the host pools of a ``HostPoolGroup`` by entry name (idempotent).

    Mutates: ``entry.host_pool._kvt_pool`` for each entry; the registry's host pools.
    """
    for entry in getattr(group, "entries", ()):
        name = getattr(entry.name, "value", entry.name)
        hp = entry.host_pool
        if hp is None:
            continue
        if name == "kv":
            tag = HOST_FULL
        elif name == "swa":
            tag = HOST_SWA
        else:
            tag = None
        try:
            hp.__dict__["_kvt_pool"] = tag
            if tag is not None:
                state.registry.host_pools[id(hp)] = hp
            else:
                state.registry.host_pools.pop(id(hp), None)
        except Exception:
            pass


def install(patcher, lazy: bool = False, level: str = "counts") -> int:
    """Wrap host pool classes (``lazy``: only if already imported). Returns count."""
    n = 0
    hb = target("sglang.srt.mem_cache.pool_host.base", lazy)
    mph = target("sglang.srt.mem_cache.memory_pool_host", lazy)
    bases = [m for m in ((hb and hb.HostKVCache), (mph and mph.LogicalHostPool)) if m]
    for b in bases:
        if level != "steps":
            for name in ("alloc", "free", "clear"):
                n += patcher.wrap_method_tree(b, name, _make_op(name))
            n += patcher.wrap_method_tree(b, "_merge_release_slots",
                                          timed_before("host_pool.merge", _staged, _account_merge))
        n += patcher.wrap_method(b, "__init__", after_init("host_pool.init", _register))
    grp = target("sglang.srt.mem_cache.pool_host.group", lazy)
    if grp is not None:
        G = grp.HostPoolGroup
        n += patcher.wrap_method(G, "__init__", after_call("host_pool.group_init", tag_group))
        n += patcher.wrap_method(G, "add_entry", after_call("host_pool.group_add_entry", tag_group))
    return n
