"""Chrome trace-event JSON (Perfetto, chrome://tracing) of a trace: ``perfetto_events``/``export_perfetto``.

Layout (timestamps in µs of trace time, sorted):

* process 1 "kvtrace pools": one counter event per ``stats`` row, named ``<pool> pool`` with
  args ``used, evictable, protected, held`` (Perfetto draws one track per pool metric); a
  trace without ``stats`` rows gets ``used`` from the allocator ledger instead (Σ alloc − Σ
  free per pool, the maximum per 10 ms bucket), so the timeline always has memory counters;
  thread 1 "scheduler": one slice per ``sched`` step row (name = mode, ``dur`` = ``step_ns``,
  cut at the next step); instants (``ph: i``) for evictions (``cache`` evict rows),
  retractions (``sched`` retract rows) and drops (``drops`` rows);
* process 2 "requests": one thread per request with slices ``queued`` (arrival to first
  admission), ``prefill`` (one per admitted chunk, until the next chunk or the end of the
  step that ran it) and ``decode`` (to the finish/abort row).
"""

from __future__ import annotations

import json
from pathlib import Path

from replay.analysis._base import POOLS_KV, as_trace
from replay.errors import KvtraceError

POOL_PID, REQ_PID, SCHED_TID = 1, 2, 1
STATS_ARGS = ("used", "evictable", "protected", "held")


#: bucket of the ledger-derived counters of a trace without ``stats`` rows
LEDGER_RESAMPLE = "10ms"


def _recorder_problems(t) -> list:
    """The rank-file problems of a trace that a recorder wrote (none for a workload, which has
    no rank files)."""
    from tracer.schema import manifest as _manifest
    from replay.trace_checks import check_ranks_accounting

    if not any(_manifest.rank_file(t.path, r).is_file() for r in t.ranks):
        return []
    return check_ranks_accounting(t)


def require_memory_rows(trace, command: str):
    """The trace, or KvtraceError when it is a workload (request rows only: no ``pool`` and no
    ``stats`` rows), naming what is missing and how to get a trace that has them."""
    t = as_trace(trace)
    if not t.rows("pool") and not t.rows("stats"):
        recorded = [q.message for q in _recorder_problems(t)]
        if recorded:  # a recorder ran (rank files) but ended before its first pool rows reached disk
            raise KvtraceError(
                f"{t.path}: the recording holds no pool and no stats rows ({t.rows('request'):,} request "
                f"rows): {'; '.join(recorded[:2])}; {command} needs pool memory: record or replay it again")
        raise KvtraceError(
            f"{t.path}: a workload, not a recorded trace: 0 pool rows and 0 stats rows "
            f"({t.rows('request'):,} request rows); {command} needs pool memory: record it first "
            f"(kvtrace record --workload {t.path} --out TRACE) or replay it (kvtrace replay {t.path} --out RUN)")
    return t


def perfetto_events(trace) -> list[dict]:
    """The trace-event list (metadata events first, then sorted by ``ts``). Pool counters come
    from the ``stats`` rows, or, in a trace without them, from the allocator ledger (Σ alloc −
    Σ free per pool, its maximum per 10 ms: counter args ``used`` only)."""
    import polars as pl

    t = require_memory_rows(trace, "export perfetto")
    ev: list[dict] = []
    stats = (t.lazy("stats").sort("seq")
             .select("ts_ns", pl.col("pool").cast(pl.String), (pl.col("capacity") - pl.col("available")).alias("used"),
                     "evictable", "protected", "held").collect())
    for ts, pool, *vals in stats.iter_rows():
        ev.append({"name": f"{pool} pool", "ph": "C", "ts": ts / 1e3, "pid": POOL_PID,
                   "args": dict(zip(STATS_ARGS, vals))})
    if not stats.height:
        ev += _ledger_counters(t)
    sched = t.lazy("sched").with_columns(pl.col("kind", "mode", "verdict").cast(pl.String)).sort("seq").collect()
    steps = sched.filter(pl.col("kind") == "step")
    st_ts = steps["ts_ns"].to_list()
    for i, r in enumerate(steps.iter_rows(named=True)):
        dur = r["step_ns"]
        if i + 1 < len(st_ts):
            dur = min(dur, st_ts[i + 1] - r["ts_ns"])
        ev.append({"name": r["mode"], "cat": "step", "ph": "X", "ts": r["ts_ns"] / 1e3, "dur": max(dur, 0) / 1e3,
                   "pid": POOL_PID, "tid": SCHED_TID,
                   "args": {"forward_ct": r["forward_ct"], "batch_size": r["batch_size"],
                            "num_tokens": r["num_tokens"]}})
    for r in sched.filter(pl.col("kind") == "retract").iter_rows(named=True):
        ev.append(_instant("retraction", r["ts_ns"], {"rid": r["rid"]}))
    evicts = t.lazy("cache").filter(pl.col("op").cast(pl.String) == "evict").sort("seq").collect()
    for r in evicts.iter_rows(named=True):
        ev.append(_instant("eviction", r["ts_ns"], {"full_tokens": r["full_tokens"], "swa_tokens": r["swa_tokens"],
                                                    "tombstones": r["tombstones"]}))
    for r in t.lazy("drops").sort("seq").collect().iter_rows(named=True):
        ev.append(_instant("drop", r["ts_ns"], {"family": r["family"], "num_events": r["num_events"],
                                                "reason": str(r["reason"])}))
    ev += _request_slices(t, sched, steps)
    ev.sort(key=lambda e: e["ts"])
    meta = [{"name": "process_name", "ph": "M", "pid": POOL_PID, "args": {"name": "kvtrace pools"}},
            {"name": "thread_name", "ph": "M", "pid": POOL_PID, "tid": SCHED_TID, "args": {"name": "scheduler"}},
            {"name": "process_name", "ph": "M", "pid": REQ_PID, "args": {"name": "requests"}}]
    return meta + ev


def _ledger_counters(t) -> list[dict]:
    from replay.analysis.occupancy import occupancy

    d = occupancy(t, pools=POOLS_KV, resample=LEDGER_RESAMPLE).drop_nulls("used_events_max").collect()
    return [{"name": f"{pool} pool", "ph": "C", "ts": t_ns / 1e3, "pid": POOL_PID, "args": {"used": int(used)}}
            for pool, t_ns, used in d.select("pool", "t_ns", "used_events_max").iter_rows()]


def _instant(name: str, ts_ns: int, args: dict) -> dict:
    return {"name": name, "cat": name, "ph": "i", "s": "p", "ts": ts_ns / 1e3, "pid": POOL_PID,
            "tid": SCHED_TID, "args": args}


def _request_slices(t, sched, steps) -> list[dict]:
    import polars as pl

    req = t.lazy("request").with_columns(pl.col("event").cast(pl.String)).collect()
    arrive = dict(req.filter(pl.col("event") == "arrival").select("rid", "ts_ns").iter_rows())
    end = dict(req.filter(pl.col("event") != "arrival").select("rid", "ts_ns").iter_rows())
    admits = (sched.filter((pl.col("kind") == "admit") & (pl.col("chunk_admitted") > 0))
              .select("seq", "ts_ns", "rid", "chunk_admitted"))
    step_end = steps.select("seq", (pl.col("ts_ns") + pl.col("step_ns")).alias("step_end_ns"))
    admits = admits.join_asof(step_end, on="seq", strategy="forward")
    chunks: dict[int, list[tuple[int, int, int]]] = {}
    for _, ts, rid, n, se in admits.iter_rows():
        chunks.setdefault(rid, []).append((ts, n, se if se is not None else ts))
    out = []
    for rid, a in arrive.items():
        cs = chunks.get(rid, [])
        fin = end.get(rid)
        first = cs[0][0] if cs else fin
        if first is not None and first > a:
            out.append(_slice("queued", a, first, rid, {}))
        for i, (ts, n, se) in enumerate(cs):
            stop = cs[i + 1][0] if i + 1 < len(cs) else se
            if fin is not None:
                stop = min(stop, fin)
            out.append(_slice("prefill", ts, max(stop, ts), rid, {"chunk_tokens": n}))
        if cs and fin is not None:
            d0 = min(max(cs[-1][2], cs[-1][0]), fin)
            if fin > d0:
                out.append(_slice("decode", d0, fin, rid, {}))
    out += [{"name": "thread_name", "ph": "M", "pid": REQ_PID, "tid": rid, "ts": 0,
             "args": {"name": f"rid {rid}"}} for rid in arrive]
    return out


def _slice(name: str, t0: int, t1: int, rid: int, args: dict) -> dict:
    return {"name": name, "cat": "request", "ph": "X", "ts": t0 / 1e3, "dur": (t1 - t0) / 1e3,
            "pid": REQ_PID, "tid": rid, "args": {"rid": rid, **args}}


def export_perfetto(trace, out) -> dict:
    """Write the JSON to ``out``; returns ``{"out": path, "events": n, "counts": {kind: n}}``."""
    events = perfetto_events(trace)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": {"source": str(as_trace(trace).path), "producer": "kvtrace"}}, f)
    counts: dict[str, int] = {}
    for e in events:
        k = "counter" if e["ph"] == "C" else e.get("cat", "metadata") if e["ph"] != "M" else "metadata"
        counts[k] = counts.get(k, 0) + 1
    return {"out": str(out), "events": len(events), "counts": counts}
