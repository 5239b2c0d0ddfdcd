"""Speed of ``kvtrace verify``: count-level events/s and page-level page ops/s.

Usage: ``python bench/verify_speed.py [--trace DIR] [--events N] [--json]``. Without ``--trace`` it
builds a synthetic schema-v1 trace of N pool events (default 2 M, standing in for the hour-long
``production_1h`` sample recorded through the backend) with pyarrow: a pool of 262,144 slots in
pages of 16, requests allocating and freeing whole pages in LIFO order, a ``stats`` row per pool
every 10 ops; page ids on every row. Counts are timed on the same trace with ``pages=False``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def synth(out: Path, num_events: int, seed: int = 0) -> Path:
    from tracer.schema import FAMILIES, SCHEMA_VERSION

    rng = np.random.default_rng(seed)
    ps, num_pages = 16, 16384
    free = list(range(num_pages, 0, -1))
    held: list[list[int]] = []
    pool_rows = {"op": [], "rid": [], "pages": []}
    n_ops = int(num_events * 10 / 11)
    for k in range(n_ops):
        if held and (len(free) < 64 or rng.random() < 0.5):
            pages = held.pop(int(rng.integers(len(held))))
            free.extend(pages)
            pool_rows["op"].append("free")
        else:
            n = int(rng.integers(1, 8))
            pages = [free.pop() for _ in range(n)]
            held.append(pages)
            pool_rows["op"].append("alloc")
        pool_rows["rid"].append(k)
        pool_rows["pages"].append(pages)
    n = len(pool_rows["op"])
    seq = np.arange(n) + np.arange(n) // 10  # room for one stats row after every 10 ops
    npages = np.array([len(p) for p in pool_rows["pages"]])
    sign = np.where(np.array(pool_rows["op"]) == "alloc", 1, -1)
    used = np.cumsum(sign * npages * ps)
    fam = FAMILIES["pool"]
    sch = fam.arrow_schema(stored=True)
    pool_t = pa.table({
        "ts_ns": pa.array(seq * 1000, pa.int64()), "seq": pa.array(seq, pa.int64()),
        "pool": pa.array(["swa"] * n).dictionary_encode().cast(sch.field("pool").type),
        "op": pa.array(pool_rows["op"]).dictionary_encode().cast(sch.field("op").type),
        "rid": pa.array(pool_rows["rid"], pa.int64()), "num_slots": pa.array(npages * ps, pa.int32()),
        "num_pages": pa.array(npages, pa.int32()), "dur_ns": pa.array(np.zeros(n), pa.int64()),
        "page_ids": pa.array(pool_rows["pages"], pa.list_(pa.int32()))}, schema=sch)
    idx = np.arange(9, n, 10)
    ssch = FAMILIES["stats"].arrow_schema(stored=True)
    cap = num_pages * ps
    stats_t = pa.table({
        "ts_ns": pa.array(seq[idx] * 1000 + 1, pa.int64()), "seq": pa.array(seq[idx] + 1, pa.int64()),
        "forward_ct": pa.array(np.arange(len(idx)), pa.int64()),
        "pool": pa.array(["swa"] * len(idx)).dictionary_encode().cast(ssch.field("pool").type),
        "capacity": pa.array(np.full(len(idx), cap), pa.int64()),
        "available": pa.array(cap - used[idx], pa.int64()), "evictable": pa.array(np.zeros(len(idx)), pa.int64()),
        "protected": pa.array(np.zeros(len(idx)), pa.int64()), "held": pa.array(used[idx], pa.int64())}, schema=ssch)
    for name, t in (("pool", pool_t), ("stats", stats_t)):
        d = out / name / "rank=0"
        d.mkdir(parents=True)
        pq.write_table(t, d / "part-00000.parquet")
    (out / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "ranks": [0],
                                                   "options": {"detail": "pages"},
                                                   "server": {"page_size": ps, "swa_pool_tokens": cap}}))
    return out


def measure(trace: Path) -> dict:
    from replay.diagnosis import verify

    counts = min((verify(trace, pages=False) for _ in range(3)), key=lambda r: r.wall_s)
    assert counts.verdict == "ok", counts.to_dict()
    out = {"trace": str(trace), "events": counts.events, "pool_rows": counts.events - counts.stats_rows_checked,
           "count_wall_s": round(counts.wall_s, 3), "count_events_per_s": round(counts.events / counts.wall_s)}
    pages = min((verify(trace) for _ in range(2)), key=lambda r: r.wall_s)
    if "page_ops" not in pages.totals:  # a counts-level trace has no page ids: count level only
        return out
    assert pages.verdict == "ok", pages.to_dict()
    return out | {"page_ops": pages.totals["page_ops"],
            "pool_rows": counts.events - counts.stats_rows_checked,
            "count_wall_s": round(counts.wall_s, 3), "page_wall_s": round(pages.wall_s, 3),
            "count_events_per_s": round(counts.events / counts.wall_s),
            "page_ops_per_s": round(pages.totals["page_ops"] / pages.wall_s),
            "page_rows_per_s": round((pages.events - pages.stats_rows_checked) / pages.wall_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="trace to verify (default: a synthetic one)")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = a.trace or synth(Path(tmp) / "synthetic", a.events)
        r = measure(trace)
        r["synthetic"] = a.trace is None
    if a.json:
        print(json.dumps(r))
    else:
        for k, v in r.items():
            print(f"{k:<20} {v}")


if __name__ == "__main__":
    from replay.errors import KvtraceError

    try:
        main()
    except KvtraceError as e:  # a trace refused: one line
        sys.exit(f"verify_speed.py: {e}")
