"""What the device-allocator hooks share (``allocator``, ``allocator_swa``, ``allocator_decode``):
the classes found at install, the row writer, the decode ledger and the SWA leaf tags.

Nothing here wraps a method. See ``allocator.py`` for how occupancy is measured.
"""

from __future__ import annotations

import tracer
from tracer.schema import Pool, PoolOp
from tracer.sglang.runtime.state import S

FULL, SWA = int(Pool.FULL), int(Pool.SWA)
ALLOC, FREE, ALLOC_FAIL = int(PoolOp.ALLOC), int(PoolOp.FREE), int(PoolOp.ALLOC_FAIL)
GROUP_BEGIN, GROUP_END = int(PoolOp.FREE_GROUP_BEGIN), int(PoolOp.FREE_GROUP_END)
MERGE, CLEAR = int(PoolOp.MERGE), int(PoolOp.CLEAR)


class Types:
    """The allocator classes of the installed sglang (set by ``allocator.install``).

    Attributes:
        leaf: the classes that own a free list (token, paged).
        swa: the SWA composite classes.
        fast: leaf classes whose ``available_size()`` is the base formula (read inline).
        is_swa: type -> is an SWA composite (``isinstance`` on these ABCs costs ~1 us: cached).
    """

    leaf: tuple = ()
    swa: tuple = ()
    fast: frozenset = frozenset()
    is_swa: dict = {}


class Ledger:
    """Rows written inside a measured outer call (``measure_decode``): while ``depth`` is set,
    ``net[pool]`` sums their slots (alloc +, free -), so the outer call writes only what they do
    not explain."""

    depth = 0
    net: list = [0] * 8


def is_swa(obj) -> bool:
    t = type(obj)
    r = Types.is_swa.get(t)
    if r is None:
        r = Types.is_swa[t] = isinstance(obj, Types.swa)
    return r


def available(a) -> int:
    """``a.available_size()`` without ``Tensor.__len__`` (a Python-level call): the free list's
    ``numel()`` plus the staged/release count, the formula of the token and paged allocators.
    Subclasses that override ``available_size`` use their own."""
    if type(a) not in Types.fast:
        return a.available_size()
    d = a.__dict__
    staged = d.get("num_staged_pages")
    if staged is not None:  # paged
        return (d["free_pages"].numel() + staged) * d["page_size"]
    return d["free_pages"].numel() + d["release_pages"].numel()


def emit(pool: int, op: int, n: int, ps: int, dur_ns: int, ids=None) -> None:
    """One ``pool`` row (``pool_ids`` with ``ids``); marks the pools changed for the sampler."""
    S.dirty = True
    if Ledger.depth and op <= FREE:  # (ALLOC 0, FREE 1)
        Ledger.net[pool] += n if op == ALLOC else -n
    if ids is None:
        tracer.pool(pool, op, S.cur_rid, n, n // ps if ps > 1 else n, dur_ns)
    else:
        tracer.pool_ids(pool, op, S.cur_rid, n, n // ps if ps > 1 else n, dur_ns, ids)


def tag_swa(a) -> None:
    """Tag the leaves of an SWA allocator with their pools (idempotent; no-op for others).

    Mutates: ``a.full_attn_allocator._kvt_pool``, ``a.swa_attn_allocator._kvt_pool`` and
    ``a._kvt_tagged``.
    """
    d = a.__dict__
    if "_kvt_tagged" in d or not Types.swa or not is_swa(a):
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
