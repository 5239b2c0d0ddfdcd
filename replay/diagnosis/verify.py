"""``kvtrace verify``: re-execute a trace's allocator ops and check them against every ``stats`` row.

The recorded ``pool`` rows are replayed against fresh pools of the recorded sizes:

- **counts** (always): per pool, the running sum of ``alloc`` minus ``free`` slots (one
  ``cumsum``) must equal ``capacity - available`` of every ``stats`` row of that pool
  (DESIGN.md §3), never go below 0 (a free of slots that were never allocated) and never above
  the capacity;
- **pages** (when the trace was recorded at ``detail=pages``): per pool and page id, the ops must
  alternate ``alloc``, ``free``, ``alloc``... starting with ``alloc``. Two frees in a row are a
  double free, a free first is a free of an unallocated page, two allocs in a row an allocation
  of a page in use. Checked for all pages at once (one ``lexsort`` by pool, page, seq);
- **identity** at every ``stats`` row: ``available + evictable + protected + held == capacity``
  (DESIGN.md §4.5). A ledger that agrees with the pools while the identity breaks is a leak in
  the server, not a bad recording.

Drop gaps (``drops`` rows) are reported as gaps, never as leaks: the ledger is re-anchored on the
first ``stats`` row after a gap and page states crossing a gap are not compared.

``verify(trace)`` returns a :class:`VerifyReport`; ``report.ok`` is True only when nothing diverges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from replay.diagnosis.columns import (ALLOC, FREE, POOL_NAMES, DiagnosisError, PoolOps, Stats,
                                      list_offsets, load_drops, load_pool, load_stats)

MAX_LISTED = 200  # findings listed per kind (the totals are always exact)
REQUEST_OPS = 8  # preceding ops of the request shown with a finding


@dataclass
class VerifyReport:
    """What :func:`verify` found. Lists hold at most ``MAX_LISTED`` findings; ``totals`` counts all."""

    trace: str
    level: str  # "pages" or "counts"
    events: int
    stats_rows_checked: int
    divergences: list[dict] = field(default_factory=list)
    identity_violations: list[dict] = field(default_factory=list)
    double_frees: list[dict] = field(default_factory=list)
    unallocated_frees: list[dict] = field(default_factory=list)
    allocs_in_use: list[dict] = field(default_factory=list)
    drop_gaps: list[dict] = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def first_divergence(self) -> dict | None:
        """The earliest (by seq) ledger divergence or page error; None when there is none."""
        cands = self.divergences[:1] + self.double_frees[:1] + self.unallocated_frees[:1] + self.allocs_in_use[:1]
        return min(cands, key=lambda f: f["seq"]) if cands else None

    @property
    def verdict(self) -> str:
        """``diverged`` (the ledger or page ops disagree), ``leak`` (ledger sound, identity
        broken), ``incomplete`` (only drop gaps) or ``ok``."""
        if self.divergences or self.double_frees or self.unallocated_frees or self.allocs_in_use:
            return "diverged"
        if self.identity_violations:
            return "leak"
        if self.drop_gaps:
            return "incomplete"
        return "ok"

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def to_dict(self) -> dict:
        return {
            "trace": self.trace, "level": self.level, "events": self.events,
            "stats_rows_checked": self.stats_rows_checked,
            "divergences": self.divergences, "first_divergence": self.first_divergence,
            "identity_violations": self.identity_violations, "double_frees": self.double_frees,
            "unallocated_frees": self.unallocated_frees, "allocs_in_use": self.allocs_in_use,
            "drop_gaps": self.drop_gaps, "totals": self.totals, "verdict": self.verdict,
            "wall_s": round(self.wall_s, 4),
        }


def verify(trace, *, rank: int = 0, pages: bool | None = None) -> VerifyReport:
    """Re-execute the ``pool`` ops of ``trace`` and check them against its ``stats`` rows.

    Args:
        trace: trace directory or an opened :class:`replay.trace.Trace`.
        rank: which rank to check.
        pages: check page ids (default: when the trace has them).
    Returns:
        the :class:`VerifyReport`.
    Raises:
        DiagnosisError: no ``stats`` rows; TraceError: unreadable trace or unknown schema major.
    """
    from time import perf_counter

    from replay.trace import Trace, open_trace

    t0 = perf_counter()
    tr = trace if isinstance(trace, Trace) else open_trace(trace)
    stats = load_stats(tr, rank)
    want_pages = pages is not False and (tr.manifest.get("options") or {}).get("detail", "pages") == "pages"
    ops = load_pool(tr, rank, pages=want_pages)
    if pages and ops.page_ids is None:
        raise DiagnosisError(f"{tr.path}: no page ids in the pool rows; record with --detail pages "
                             "or verify at count level")
    gaps = _drop_gaps(load_drops(tr, rank))
    rep = VerifyReport(str(Path(tr.path)), "pages" if ops.page_ids is not None else "counts",
                       events=len(ops.seq) + len(stats.seq), stats_rows_checked=len(stats.seq),
                       drop_gaps=gaps)
    gap_at = np.array([g["after_seq"] for g in gaps], dtype=np.int64)
    _check_counts(rep, ops, stats, gap_at)
    _check_identity(rep, stats)
    if ops.page_ids is not None:
        _check_pages(rep, ops, gap_at)
    for name in ("double_frees", "unallocated_frees", "allocs_in_use"):
        getattr(rep, name).sort(key=lambda f: f["seq"])
        rep.totals[name] = rep.totals.get(name, 0)
        setattr(rep, name, getattr(rep, name)[:MAX_LISTED])
    rep.wall_s = perf_counter() - t0
    return rep


# ------------------------------------------------------------------ gaps
def _drop_gaps(drops: list[dict]) -> list[dict]:
    out = []
    for d in drops:
        lo = d["first_seq"] if d["first_seq"] is not None and d["first_seq"] >= 0 else d["seq"]
        hi = d["last_seq"] if d["last_seq"] is not None and d["last_seq"] >= 0 else d["seq"]
        out.append({"after_seq": int(lo) - 1, "first_seq": int(lo), "last_seq": int(hi),
                    "num_events": int(d["num_events"]), "family": d["family"] or "",
                    "reason": str(d["reason"]), "ts_ns": int(d["ts_ns"]),
                    "note": "events lost: the ledger is re-anchored after the gap (not a leak)"})
    return out


# ------------------------------------------------------------------ counts
def _check_counts(rep: VerifyReport, ops: PoolOps, st: Stats, gap_at: np.ndarray) -> None:
    is_change = (ops.op == ALLOC) | (ops.op == FREE)
    delta_all = np.where(ops.op == ALLOC, ops.num_slots, -ops.num_slots)
    divergences, total = [], 0
    under = []
    for p in sorted(set(np.unique(st.pool).tolist()) | set(np.unique(ops.pool[is_change]).tolist())):
        m = is_change & (ops.pool == p)
        seqs = ops.seq[m]
        used = np.concatenate([[0], np.cumsum(delta_all[m])])
        sidx = np.flatnonzero(st.pool == p)
        if len(sidx):
            cap = st.capacity[sidx]
            k = np.searchsorted(seqs, st.seq[sidx])
            found = used[k]
            expected = cap - st.available[sidx]
            offset = np.zeros(len(sidx), np.int64)
            if len(gap_at):
                epoch = np.searchsorted(gap_at, st.seq[sidx], side="right")
                for e in np.unique(epoch[epoch > 0]):
                    first = np.flatnonzero(epoch == e)[0]
                    offset[epoch == e] = expected[first] - found[first]
            found = found + offset
            bad = np.flatnonzero(found != expected)
            total += len(bad)
            for i in bad[:MAX_LISTED]:
                divergences.append(_divergence(ops, st, m, sidx, i, int(expected[i]), int(found[i]), p))
        # a running count below zero: slots freed that were never allocated (before any gap)
        first_gap = gap_at[0] if len(gap_at) else np.iinfo(np.int64).max
        neg = np.flatnonzero((used[1:] < 0) & (seqs <= first_gap))
        if len(neg):
            j = np.flatnonzero(m)[neg[0]]
            under.append(_op_finding(ops, j, "count_below_zero",
                                     f"{POOL_NAMES.get(p, p)}: ledger {int(used[neg[0] + 1])} < 0 "
                                     "after this free (slots freed that were never allocated)"))
    divergences.sort(key=lambda f: f["seq"])
    rep.divergences = divergences[:MAX_LISTED]
    rep.totals["divergences"] = total
    rep.unallocated_frees.extend(under)
    rep.totals["unallocated_frees"] = rep.totals.get("unallocated_frees", 0) + len(under)


def _divergence(ops: PoolOps, st: Stats, m: np.ndarray, sidx: np.ndarray, i: int, expected: int,
                found: int, p: int) -> dict:
    row = sidx[i]
    lo = int(st.seq[sidx[i - 1]]) if i > 0 else -1
    hi = int(st.seq[row])
    in_win = np.flatnonzero(m & (ops.seq > lo) & (ops.seq < hi))
    rids = ops.rid[in_win]
    rid = int(rids[rids >= 0][-1]) if np.any(rids >= 0) else -1
    return {
        "kind": "ledger_vs_stats", "seq": hi, "ts_ns": int(st.ts_ns[row]), "step": int(st.forward_ct[row]),
        "pool": POOL_NAMES.get(p, str(p)), "expected": expected, "found": found, "diff": expected - found,
        "window": [lo, hi], "ops_in_window": [_op(ops, j) for j in in_win[-REQUEST_OPS:]],
        "rid": rid, "request_ops": _request_ops(ops, rid, hi),
        "message": (f"stats row seq {hi} (step {int(st.forward_ct[row])}) says {expected} slots used "
                    f"(capacity - available); the pool ops since the trace began sum to {found}; "
                    f"the fault lies in seq ({lo}, {hi}]"),
    }


def _op(ops: PoolOps, j: int) -> dict:
    from tracer.schema import PoolOp

    try:
        opname = PoolOp(int(ops.op[j])).name.lower()
    except ValueError:
        opname = str(int(ops.op[j]))
    return {"seq": int(ops.seq[j]), "ts_ns": int(ops.ts_ns[j]), "pool": POOL_NAMES.get(int(ops.pool[j])),
            "op": opname, "rid": int(ops.rid[j]), "num_slots": int(ops.num_slots[j])}


def _request_ops(ops: PoolOps, rid: int, before_seq: int) -> list[dict]:
    if rid < 0:
        return []
    idx = np.flatnonzero((ops.rid == rid) & (ops.seq <= before_seq))
    return [_op(ops, j) for j in idx[-REQUEST_OPS:]]


def _op_finding(ops: PoolOps, j: int, kind: str, message: str, **extra) -> dict:
    out = _op(ops, j)
    out.update(kind=kind, message=message, request_ops=_request_ops(ops, out["rid"], out["seq"]), **extra)
    return out


# ------------------------------------------------------------------ identity
def _check_identity(rep: VerifyReport, st: Stats) -> None:
    total = st.available + st.evictable + st.protected + st.held
    bad = np.flatnonzero(total != st.capacity)
    rep.totals["identity_violations"] = len(bad)
    for i in bad[:MAX_LISTED]:
        gap = int(st.capacity[i] - total[i])
        rep.identity_violations.append({
            "seq": int(st.seq[i]), "ts_ns": int(st.ts_ns[i]), "step": int(st.forward_ct[i]),
            "pool": POOL_NAMES.get(int(st.pool[i])), "capacity": int(st.capacity[i]),
            "available": int(st.available[i]), "evictable": int(st.evictable[i]),
            "protected": int(st.protected[i]), "held": int(st.held[i]), "unaccounted": gap,
            "message": (f"available+evictable+protected+held = {int(total[i])} != capacity "
                        f"{int(st.capacity[i])}: {gap} slots " + ("held by nobody (lost)" if gap > 0
                                                                 else "counted twice")),
        })


# ------------------------------------------------------------------ pages
def _check_pages(rep: VerifyReport, ops: PoolOps, gap_at: np.ndarray) -> None:
    offsets, flat = list_offsets(ops.page_ids)
    lens = np.diff(offsets)
    rows = np.repeat(np.arange(len(lens)), lens)
    keep = (ops.op[rows] == ALLOC) | (ops.op[rows] == FREE)
    rows, page = rows[keep], flat[keep]
    rep.totals["page_ops"] = len(page)
    if not len(page):
        return
    pool = ops.pool[rows].astype(np.int64)
    seq = ops.seq[rows]
    is_alloc = ops.op[rows] == ALLOC
    order = np.lexsort((seq, page, pool))
    rows, page, pool, seq, is_alloc = rows[order], page[order], pool[order], seq[order], is_alloc[order]
    epoch = np.searchsorted(gap_at, seq, side="left") if len(gap_at) else np.zeros(len(seq), np.int64)
    new_key = np.ones(len(page), bool)
    new_key[1:] = (page[1:] != page[:-1]) | (pool[1:] != pool[:-1])
    same_epoch = np.ones(len(page), bool)
    same_epoch[1:] = epoch[1:] == epoch[:-1]
    prev_alloc = np.zeros(len(page), bool)
    prev_alloc[1:] = is_alloc[:-1]
    cont = ~new_key & same_epoch
    double_free = cont & ~is_alloc & ~prev_alloc
    alloc_in_use = cont & is_alloc & prev_alloc
    unalloc_free = new_key & ~is_alloc & (epoch == 0)
    reserved = is_alloc & (page == 0)
    for mask, kind, key, what in (
            (double_free, "double_free", "double_frees", "freed again; its previous op was a free"),
            (unalloc_free, "free_unallocated", "unallocated_frees", "freed but never allocated"),
            (alloc_in_use, "alloc_in_use", "allocs_in_use", "allocated while in use (previous op: alloc)"),
            (reserved, "alloc_reserved", "allocs_in_use", "reserved page 0 handed out")):
        idx = np.flatnonzero(mask)
        rep.totals[key] = rep.totals.get(key, 0) + len(idx)
        for i in idx[:MAX_LISTED]:
            j = int(rows[i])
            prev = None if new_key[i] else _op(ops, int(rows[i - 1]))
            getattr(rep, key).append(_op_finding(
                ops, j, kind, f"{POOL_NAMES.get(int(pool[i]))} page {int(page[i])} {what}",
                page=int(page[i]), previous_op=prev))
