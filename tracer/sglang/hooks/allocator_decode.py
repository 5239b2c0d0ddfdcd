"""Decode allocation on ``ScheduleBatch.prepare_for_decode`` (``sglang.srt.mem_cache.allocator``).

``alloc_decode`` (two leaf calls per decode step on SWA models) is not wrapped: its only caller
in 0.5.23 is ``prepare_for_decode`` (through ``alloc_for_decode``), so :func:`measure_decode`
reads the leaves' available sizes around that call (inline, it runs at every decode step) and
writes one ``alloc`` row per pool for what the rows written inside (evictions, out-of-window
frees) do not explain. Those rows carry the duration of ``prepare_for_decode``.
"""

from __future__ import annotations

from time import perf_counter_ns

import tracer
from tracer.sglang.hooks.allocator_common import (ALLOC, FREE, FULL, SWA, Ledger, Types, is_swa,
                                                 tag_swa)
from tracer.sglang.hooks.page_ids import ids_numpy
from tracer.sglang.runtime import state
from tracer.sglang.runtime.state import S
from tracer.sglang.targets.contract import Contract


# Installed by ``schedule_batch`` (the wrapper of ``prepare_for_decode`` calls ``measure_decode``).
CONTRACTS: tuple[Contract, ...] = (
    Contract("pool.device_decode", "sglang.srt.managers.schedule_batch", "ScheduleBatch",
             "prepare_for_decode", params="(self)",
             reads=("token_to_kv_pool_allocator", "out_cache_loc")),
)


def _leaves(a) -> tuple:
    """``((leaf, pool, leaf.__dict__ or None), ...)`` of a top-level allocator: the SWA
    composite's two leaves, or the allocator itself (the ``__dict__`` when the leaf's available
    size is the token/paged formula, read inline). Cached on it (``_kvt_leaves``; ``tag_swa``
    resets it)."""
    d = a.__dict__
    lv = d.get("_kvt_leaves")
    if lv is None:
        if Types.swa and is_swa(a):
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
                out.append((leaf, pool, leaf.__dict__ if type(leaf) in Types.fast else None))
        lv = d["_kvt_leaves"] = tuple(out)
    return lv


def _decode_ids(batch, a, pool: int):
    """detail=pages: the pages a decode step took, from the slots it returned (a page is new
    where its first slot was handed out); the SWA side through the full->SWA mapping."""
    loc = batch.out_cache_loc
    if loc is None:
        return None
    ps = a.page_size
    if pool == SWA and is_swa(a):
        loc = a.translate_loc_from_full_to_swa(loc)
    return ids_numpy([loc[loc % ps == 0] // ps])


def measure_decode(batch, orig):
    """Run ``orig(batch)`` (``ScheduleBatch.prepare_for_decode``) and write one ``alloc`` row per
    pool for the decode allocation: the leaves' change of available size minus what the rows
    written inside explain (evictions, out-of-window releases). Returns what ``orig`` returns.
    (Runs at every decode step: the leaves' sizes are read inline.)
    """
    if Ledger.depth:
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
    Ledger.depth, Ledger.net = 1, [0] * 8
    t0 = perf_counter_ns()
    out = None
    try:
        out = orig(batch)
        return out
    finally:
        dur = perf_counter_ns() - t0
        Ledger.depth = 0
        try:
            net = Ledger.net
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
    S.dirty = True
    op = ALLOC if n > 0 else FREE
    n = n if n > 0 else -n
    if S.pages and op == ALLOC:
        tracer.pool_ids(pool, op, S.cur_rid, n, n // ps if ps > 1 else n, dur,
                        _decode_ids(batch, a, pool))
    else:
        tracer.pool(pool, op, S.cur_rid, n, n // ps if ps > 1 else n, dur)
