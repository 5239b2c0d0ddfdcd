"""Who holds SWA slots outside their window, for how long, and why (``doctor``'s attribution).

Evidence comes from the trace alone (``cache`` rows carry the request; ``stats`` rows the pools):

=====================================  ==========================================================
cause                                  evidence
=====================================  ==========================================================
``slots_lost_by_allocator``            identity gap ``capacity - (available + evictable +
                                       protected + held)`` > 0: slots nobody owns; slot-seconds
                                       are the gap integrated over time
``protected_prefix_pinned``            a request's ``lock`` rows outnumber its ``unlock`` rows
                                       after it finished: its path stays protected to the end
``window_lock_held_through_decode``    a request's SWA window lock (``lock`` row ``swa_tokens``)
                                       held while it decodes past one window; a lock whose
                                       ``unlock`` row carries no SWA tokens had its window
                                       released at the window (``release_swa``,
                                       ``SGLANG_OPT_RELEASE_PREFILL_SWA``) and is not counted
``private_range_kept_until_finish``    at ``release``, the request-private range (allocated -
                                       protected) minus what decode released (``swa_release``
                                       rows after its last insert) exceeds two windows
``unfinished_insert_without_release``  a checkpoint ``insert`` of an unfinished request with no
                                       ``swa_release`` of that request since its previous insert
``all_tombstone_last_leaf``            SWA identity gap < 0: the tree counts more SWA slots
                                       (evictable + protected) than the allocator has in use, as
                                       when a span decode already freed is inserted as a live
                                       leaf (pre-#29860 boundary + pre-#22470 insert); each drop
                                       of the gap is charged to the request whose ``insert``
                                       came last before it
=====================================  ==========================================================

Holders are requests (trace ``rid``) or ``allocator``; the trace has no tree node ids, so a
tree node is named by the request whose lock or insert put it there.
"""

from __future__ import annotations

import numpy as np

from tracer.schema import CacheOp, Pool

LOCK, UNLOCK, INSERT = int(CacheOp.LOCK), int(CacheOp.UNLOCK), int(CacheOp.INSERT)
SWA_RELEASE, RELEASE = int(CacheOp.SWA_RELEASE), int(CacheOp.RELEASE)
SWA = int(Pool.SWA)
NS = 1e9


def attribute(cache: dict, req: dict, st, *, window: int, page: int) -> list[dict]:
    """Holder rows: ``{holder, rid, cause, slots, slot_seconds, since_ns, until_ns, detail}``."""
    end_ns = int(max(st.ts_ns.max(initial=0), cache["ts_ns"].max(initial=0)))
    out_len = {int(r): int(o) for r, o, e in zip(req["rid"], req["output_len"], req["event"]) if e == 1}
    keep = -(-max(window, page) // page) * page + page
    out: list[dict] = []
    out += _lost(st)
    out += _overcounted(st, cache)
    by_rid: dict[int, list[int]] = {}
    for i, r in enumerate(cache["rid"].tolist()):
        if r >= 0:
            by_rid.setdefault(r, []).append(i)
    for rid, idx in by_rid.items():
        idx = np.asarray(idx)
        ops, ts, swa, full = (cache[k][idx] for k in ("op", "ts_ns", "swa_tokens", "full_tokens"))
        rel = np.flatnonzero(ops == RELEASE)
        t_rel = int(ts[rel[-1]]) if len(rel) else end_ns
        out += _pinned(rid, ops, ts, swa, full, t_rel, end_ns)
        out += _window_lock(rid, ops, ts, swa, out_len.get(rid, 0), window)
        if len(rel):
            out += _private(rid, ops, ts, swa, full, rel[-1], keep)
        out += _unfinished(rid, ops, ts, full, t_rel, window)
    return sorted(out, key=lambda h: -h["slot_seconds"])


def _lost(st) -> list[dict]:
    m = st.pool == SWA
    if not np.any(m):
        m = st.pool == int(Pool.FULL)
    gap = (st.capacity - st.available - st.evictable - st.protected - st.held)[m]
    ts = st.ts_ns[m]
    if not np.any(gap > 0):
        return []
    dt = np.diff(ts, append=ts[-1]) / NS
    first = int(np.flatnonzero(gap > 0)[0])
    return [{"holder": "allocator (no owner)", "rid": -1, "cause": "slots_lost_by_allocator",
             "slots": int(gap[-1]), "slot_seconds": float(np.sum(np.clip(gap, 0, None) * dt)),
             "since_ns": int(ts[first]), "until_ns": int(ts[-1]),
             "detail": f"identity gap grows to {int(gap.max())} slots (first at seq {int(st.seq[m][first])})"}]


def _overcounted(st, cache) -> list[dict]:
    m = st.pool == SWA
    if not np.any(m):
        return []
    gap = (st.capacity - st.available - st.evictable - st.protected - st.held)[m]
    if not np.any(gap < 0):
        return []
    ts, seq = st.ts_ns[m], st.seq[m]
    end = int(ts[-1])
    ins = np.flatnonzero((cache["op"] == INSERT) & (cache["rid"] >= 0))
    ins_seq, ins_rid = cache["seq"][ins], cache["rid"][ins]
    drop = np.diff(gap, prepend=0)
    out: dict[int, dict] = {}
    for i in np.flatnonzero(drop < 0):
        k = np.searchsorted(ins_seq, seq[i]) - 1
        rid = int(ins_rid[k]) if k >= 0 else -1
        # the over-count lasts until the gap recovers (the leaf is evicted) or the trace ends
        back = np.flatnonzero(gap[i:] > gap[i] - drop[i])
        until = int(ts[i + back[0]]) if len(back) else end
        h = out.setdefault(rid, {"holder": f"tree leaf inserted by request {rid} (SWA over-counted)" if rid >= 0
                                 else "tree (SWA over-counted)", "rid": rid, "cause": "all_tombstone_last_leaf",
                                 "slots": 0, "slot_seconds": 0.0, "since_ns": int(ts[i]), "until_ns": until,
                                 "detail": ""})
        h["slots"] += int(-drop[i])
        h["slot_seconds"] += float(-drop[i] * (until - ts[i]) / NS)
        h["until_ns"] = max(h["until_ns"], until)
    first = int(np.flatnonzero(gap < 0)[0])
    for h in out.values():
        h["detail"] = (f"identity gap below zero (the tree counts {h['slots']} SWA slots the allocator holds "
                       f"free; first at seq {int(seq[first])}, lowest {int(gap.min())}): a leaf whose SWA "
                       "decode already freed was inserted as live")
    return list(out.values())


def _pinned(rid, ops, ts, swa, full, t_rel, end_ns) -> list[dict]:
    locks, unlocks = np.flatnonzero(ops == LOCK), np.flatnonzero(ops == UNLOCK)
    extra = len(locks) - len(unlocks)
    if extra <= 0 or t_rel >= end_ns:
        return []
    # the unmatched locks are the latest ones whose receipt was dropped; count their tokens
    held = locks[-extra:]
    slots = int(swa[held].sum()) or int(full[held].sum())
    return [{"holder": f"tree path locked by request {rid}", "rid": rid, "cause": "protected_prefix_pinned",
             "slots": slots, "slot_seconds": float(slots * (end_ns - t_rel) / NS),
             "since_ns": int(t_rel), "until_ns": int(end_ns),
             "detail": f"{len(locks)} lock rows, {len(unlocks)} unlock rows: {extra} never released after the request finished"}]


def _window_lock(rid, ops, ts, swa, out_len, window) -> list[dict]:
    if out_len <= window:
        return []
    frac = (out_len - window) / out_len
    out, open_ = [], []
    for k in range(len(ops)):
        if ops[k] == LOCK and swa[k] > 0:
            open_.append(k)
        elif ops[k] == UNLOCK and open_:
            j = open_.pop(0)
            if swa[k] == 0:  # the window was released at the window (release_swa): not held through
                continue
            secs = (ts[k] - ts[j]) / NS * frac
            if secs > 0:
                out.append({"holder": f"request {rid} (SWA window lock)", "rid": rid,
                            "cause": "window_lock_held_through_decode", "slots": int(swa[j]),
                            "slot_seconds": float(swa[j] * secs), "since_ns": int(ts[j]),
                            "until_ns": int(ts[k]),
                            "detail": f"{int(swa[j])} SWA tokens locked while decoding {out_len} tokens (window {window})"})
    return out


def _private(rid, ops, ts, swa, full, r, keep) -> list[dict]:
    private = int(full[r])
    ins = np.flatnonzero((ops == INSERT) & (ts < ts[r]))
    start = ins[-1] if len(ins) else 0
    decode_released = int(swa[(ops == SWA_RELEASE) & (np.arange(len(ops)) > start) & (np.arange(len(ops)) < r)].sum())
    outside = private - decode_released - keep
    if outside <= keep:
        return []
    t0 = int(ts[start])
    return [{"holder": f"request {rid} (private KV row)", "rid": rid, "cause": "private_range_kept_until_finish",
             "slots": outside, "slot_seconds": float(outside * (ts[r] - t0) / NS / 2),
             "since_ns": t0, "until_ns": int(ts[r]),
             "detail": f"{private} private tokens at finish, {decode_released} released by decode, "
                       f"{outside} outside the window"}]


def _unfinished(rid, ops, ts, full, t_rel, window) -> list[dict]:
    out, last = [], -1
    for k in np.flatnonzero(ops == INSERT):
        if ts[k] >= t_rel or full[k] <= window:
            last = k
            continue
        released = np.any(ops[last + 1:k] == SWA_RELEASE)
        if not released:
            slots = int(full[k]) - window
            out.append({"holder": f"tree nodes inserted by request {rid} (chunk)", "rid": rid,
                        "cause": "unfinished_insert_without_release", "slots": slots,
                        "slot_seconds": float(slots * (t_rel - ts[k]) / NS), "since_ns": int(ts[k]),
                        "until_ns": int(t_rel),
                        "detail": f"chunk of {int(full[k])} tokens inserted live; no out-of-window release at insert"})
        last = k
    return out
