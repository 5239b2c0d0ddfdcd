"""Helpers for the tracer-hook tests: trace checks shared by the scenario and end-to-end tests."""

from __future__ import annotations

import numpy as np

from replay.trace import open_trace


def _col(table, name):
    col = table.column(name)
    if hasattr(col.type, "list_size") or str(col.type).startswith("list"):
        return col.to_pylist()
    if hasattr(col.type, "value_type"):  # dictionary-encoded enum strings
        col = col.cast(col.type.value_type)
    return np.asarray(col.to_pylist() if col.type == "string" else col.to_numpy())


def pool_ops(trace_dir, rank: int = 0) -> dict[str, dict[str, int]]:
    """{pool: {op: rows}} of a trace rank."""
    t = open_trace(trace_dir).table("pool", rank)
    pools, ops = _col(t, "pool"), _col(t, "op")
    out: dict[str, dict[str, int]] = {}
    for p, o in zip(pools, ops):
        out.setdefault(str(p), {}).setdefault(str(o), 0)
        out[str(p)][str(o)] += 1
    return out


def ledger_mismatches(trace_dir, rank: int = 0) -> tuple[int, list[str]]:
    """Check sum(alloc) - sum(free) of each pool == capacity - available at every stats row.

    Returns:
        (stats rows checked, descriptions of the rows that disagree).
    """
    tr = open_trace(trace_dir)
    pool_t, stats_t = tr.table("pool", rank), tr.table("stats", rank)
    p_seq, p_pool, p_op = _col(pool_t, "seq"), _col(pool_t, "pool"), _col(pool_t, "op")
    p_n = _col(pool_t, "num_slots").astype(np.int64)
    sign = np.where(p_op == "alloc", 1, np.where(p_op == "free", -1, 0))
    s_seq, s_pool = _col(stats_t, "seq"), _col(stats_t, "pool")
    cap, avail = _col(stats_t, "capacity"), _col(stats_t, "available")
    bad = []
    for name in sorted(set(s_pool.tolist())):
        m = p_pool == name
        order = np.argsort(p_seq[m])
        seqs = p_seq[m][order]
        used = np.concatenate([[0], np.cumsum((sign[m] * p_n[m])[order])])
        for i in np.flatnonzero(s_pool == name):
            k = np.searchsorted(seqs, s_seq[i])
            want = int(cap[i] - avail[i])
            if int(used[k]) != want:
                bad.append(f"{name} seq={s_seq[i]}: ledger {int(used[k])} != capacity-available {want}")
    return len(s_seq), bad


def identity_mismatches(trace_dir, rank: int = 0) -> tuple[int, list[str]]:
    """Check available + evictable + protected + held == capacity at every stats row."""
    t = open_trace(trace_dir).table("stats", rank)
    cols = {c: _col(t, c) for c in ("seq", "pool", "capacity", "available", "evictable",
                                    "protected", "held")}
    total = cols["available"] + cols["evictable"] + cols["protected"] + cols["held"]
    bad = [f"{cols['pool'][i]} seq={cols['seq'][i]}: a+e+p+h={int(total[i])} != cap={int(cols['capacity'][i])}"
           f" (a={cols['available'][i]} e={cols['evictable'][i]} p={cols['protected'][i]} h={cols['held'][i]})"
           for i in np.flatnonzero(total != cols["capacity"])]
    return len(total), bad


def ledger(trace_dir, rank: int = 0) -> dict[str, int]:
    """sum(alloc) - sum(free) of num_slots per pool over the whole trace rank."""
    t = open_trace(trace_dir).table("pool", rank)
    out: dict[str, int] = {}
    for p, o, n in zip(_col(t, "pool"), _col(t, "op"), _col(t, "num_slots")):
        if o in ("alloc", "free"):
            out[str(p)] = out.get(str(p), 0) + (int(n) if o == "alloc" else -int(n))
    return out


def rows(trace_dir, family: str, rank: int = 0) -> list[dict]:
    """All rows of a family as dicts, in seq order (enum columns as their names)."""
    t = open_trace(trace_dir).table(family, rank)
    cols = {c: _col(t, c) for c in t.column_names}
    out = [{c: (v[i].item() if hasattr(v[i], "item") else v[i]) for c, v in cols.items()}
           for i in range(t.num_rows)]
    return sorted(out, key=lambda r: r["seq"])
