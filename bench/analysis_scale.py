"""Scale of the analysis queries: build an N-event ``pool`` + ``stats`` trace on disk with pyarrow,
then time ``occupancy`` and ``churn`` in DuckDB and in Polars, each in a fresh process (peak RSS =
its VmHWM; CPU seconds too, since the machine is shared), check that both engines return the
same rows, and report the 1-min load average around the run. Optionally the capacity curve of a
workload.

    .venv/bin/python bench/analysis_scale.py --json                      # 100 M events
    .venv/bin/python bench/analysis_scale.py --events 10000000 --json
    .venv/bin/python bench/analysis_scale.py --capacity data/workloads/production_1h --capacity-only --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 10_000_000
STATS_EVERY = 100  # one stats row per pool per this many pool events


def build(out: Path, events: int) -> dict:
    import numpy as np
    import pyarrow as pa

    from tracer.schema import FAMILIES, SCHEMA_VERSION
    from tracer.schema.storage import to_stored, write_parquet

    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    part = 0
    for start in range(0, events, CHUNK):
        n = min(CHUNK, events - start)
        i = np.arange(start, start + n, dtype=np.int64)
        seq = 1 + i + i // STATS_EVERY * 2  # from 1; two stats rows after every STATS_EVERY pool rows
        ts = i * 10_000  # 100 k events per second of trace
        pool = (i // 2 % 2).astype(np.uint8)
        op = (i // 4 % 2).astype(np.uint8)  # alloc, alloc, free, free per pool pair
        slots = np.full(n, 16, np.int32)
        tbl = pa.table({"ts_ns": ts, "seq": seq, "pool": pool, "op": op, "rid": i // 4,
                        "num_slots": slots, "num_pages": np.ones(n, np.int32),
                        "dur_ns": rng.integers(1_000, 50_000, n)})
        d = out / "pool" / "rank=0"
        d.mkdir(parents=True, exist_ok=True)
        write_parquet(d / f"part-{part:05d}.parquet", to_stored(tbl, FAMILIES["pool"]))
        k = np.arange(start // STATS_EVERY, (start + n) // STATS_EVERY, dtype=np.int64)
        sts = np.repeat(k * STATS_EVERY * 10_000, 2)
        sseq = 1 + np.repeat(k * (STATS_EVERY + 2) + STATS_EVERY, 2) + np.tile([0, 1], len(k))
        avail = rng.integers(0, 1 << 20, len(sts))
        st = pa.table({"ts_ns": sts, "seq": sseq, "forward_ct": np.repeat(k, 2),
                       "pool": np.tile(np.array([0, 1], np.uint8), len(k)),
                       "capacity": np.full(len(sts), 1 << 20), "available": avail,
                       "evictable": (1 << 20) - avail, "protected": np.zeros(len(sts), np.int64),
                       "held": np.zeros(len(sts), np.int64)})
        d = out / "stats" / "rank=0"
        d.mkdir(parents=True, exist_ok=True)
        write_parquet(d / f"part-{part:05d}.parquet", to_stored(st, FAMILIES["stats"]))
        part += 1
        print(f"built {start + n:,}/{events:,} events", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "ranks": [0],
                                                   "hash_block_tokens": 16, "server": {"page_size": 16}}))
    return {"build_s": time.perf_counter() - t0,
            "bytes": sum(f.stat().st_size for f in out.rglob("*.parquet"))}


_CHILD = """
import json, sys, time
from replay.analysis import occupancy, churn, capacity_curve
what, engine, path, out = sys.argv[1:5]
t0, c0 = time.perf_counter(), time.process_time()
rows = 0
if what == "capacity":
    rows = len(capacity_curve(path).capacity_tokens)
else:
    q = (occupancy(path, resample="1s", engine=engine) if what == "occupancy"
         else churn(path, window="1s", engine=engine))
    df = q.collect() if engine == "polars" else q.pl()
    rows = df.height
s, cpu = time.perf_counter() - t0, time.process_time() - c0
if what != "capacity":
    df.write_parquet(out)
rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] / 1024
print(json.dumps({"s": s, "cpu_s": cpu, "rss_mb": rss, "rows": rows}))
"""


def timed(what: str, engine: str, path: Path, out: Path) -> dict:
    """Run one query in a fresh process (so its VmHWM is its own peak RSS); its rows go to ``out``."""
    r = subprocess.run([sys.executable, "-c", _CHILD, what, engine, str(path), str(out)],
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{what}/{engine} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000_000, help="pool events to build (default 100 M)")
    ap.add_argument("--dir", default=None, help="where to build the trace (default: a temp dir, removed)")
    ap.add_argument("--capacity", default=None, help="also time capacity_curve of this workload/trace")
    ap.add_argument("--capacity-only", action="store_true", help="skip the event trace (with --capacity)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    import shutil

    import polars as pl
    from polars.testing import assert_frame_equal

    from replay.analysis.occupancy import events_in_seq_order

    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kvtrace-scale-"))
    res = {"events": a.events, "load_avg_1m_start": round(os.getloadavg()[0], 2)}
    try:
        if a.capacity_only:
            res.pop("events")
        else:
            info = build(root / "trace", a.events)
            res.update(trace_bytes=info["bytes"], build_s=round(info["build_s"], 2),
                       occupancy_streaming=events_in_seq_order(root / "trace"))
            peak = 0.0
            for what in ("occupancy", "churn"):
                outs = {}
                for engine in ("duckdb", "polars"):
                    outs[engine] = root / f"{what}-{engine}.parquet"
                    m = timed(what, engine, root / "trace", outs[engine])
                    res[f"{engine}_{what}_s"] = round(m["s"], 2)
                    res[f"{engine}_{what}_cpu_s"] = round(m["cpu_s"], 2)
                    res[f"{engine}_{what}_rss_mb"] = round(m["rss_mb"])
                    peak = max(peak, m["rss_mb"])
                a_, b_ = (pl.read_parquet(outs[e]) for e in ("duckdb", "polars"))
                assert_frame_equal(a_, b_)  # raises if the engines disagree
                res[f"{what}_rows"] = a_.height
                res[f"{what}_engines_agree"] = True
            res["peak_rss_mb"] = round(peak)
        if a.capacity:
            m = timed("capacity", "polars", Path(a.capacity), root / "capacity.parquet")
            res["capacity_curve_s"], res["capacity_curve_cpu_s"] = round(m["s"], 2), round(m["cpu_s"], 2)
            res["capacity_curve_rss_mb"] = round(m["rss_mb"])
        res["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(res) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
