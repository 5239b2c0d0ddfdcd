"""Hand-built small traces for exact-number tests (written with the schema's storage API)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tracer.schema import FAMILIES, SCHEMA_VERSION
from tracer.schema.storage import to_stored, write_parquet

S = 1_000_000_000


def write_trace(path: Path, rows: dict[str, list[dict]], page_size: int = 16,
                hash_block_tokens: int = 16) -> Path:
    """Write ``rows`` (family -> list of row dicts, enums as strings) as a schema-v1 trace.

    ``seq`` is assigned in the order rows are given across families when absent (so pass them
    already in event order per family and set ``seq`` explicitly when the interleaving matters).
    """
    path.mkdir(parents=True, exist_ok=True)
    for fam, frows in rows.items():
        if not frows:
            continue
        f = FAMILIES[fam]
        cols = {}
        for c in f.columns:
            vals = [r.get(c.name, _default(c)) for r in frows]
            cols[c.name] = pa.array(vals, pa.string() if c.enum is not None else c.type)
        table = to_stored(pa.table(cols), f)
        d = path / fam / "rank=0"
        d.mkdir(parents=True, exist_ok=True)
        write_parquet(d / "part-00000.parquet", table)
    manifest = {"schema_version": SCHEMA_VERSION, "producer": {"name": "kvtrace", "source": "test"},
                "hash_block_tokens": hash_block_tokens, "ranks": [0],
                "server": {"page_size": page_size, "sliding_window_tokens": 0}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def _default(c):
    if c.name in ("rid", "session_id", "turn", "output_len", "cached_len", "rem_swa", "swa_needed"):
        return -1
    if pa.types.is_list(c.type):
        return None
    if pa.types.is_string(c.type):
        return ""
    if c.enum is not None:
        return {"event": "arrival", "kind": "step", "mode": "idle", "verdict": "none",
                "op": "alloc", "pool": "full", "reason": "buffer_full"}[c.name]
    return 0


def small_rows() -> dict[str, list[dict]]:
    """A 3-second trace on pools full and swa with known occupancy, churn and request numbers."""
    seq = iter(range(1, 10_000))
    pool, stats, cache, sched, req = [], [], [], [], []

    def p(ts, pl_, op, n, dur=0, rid=-1):
        pool.append(dict(ts_ns=ts, seq=next(seq), pool=pl_, op=op, num_slots=n, num_pages=n // 16,
                         dur_ns=dur, rid=rid))

    def st(ts, pl_, cap, avail, ev, prot, held):
        stats.append(dict(ts_ns=ts, seq=next(seq), pool=pl_, capacity=cap, available=avail,
                          evictable=ev, protected=prot, held=held))

    # request 0 (session 5): arrives t=0.1, matched twice, admitted in two chunks, finishes t=1.5
    req.append(dict(ts_ns=S // 10, seq=next(seq), event="arrival", rid=0, session_id=5, input_len=64,
                    output_len=-1, max_new_tokens=32, page_hashes=[11, 12, 13, 14]))
    cache.append(dict(ts_ns=S // 10, seq=next(seq), op="match", rid=0, device_hit=16))
    cache.append(dict(ts_ns=2 * S // 10, seq=next(seq), op="match", rid=0, device_hit=32))
    sched.append(dict(ts_ns=2 * S // 10, seq=next(seq), kind="admit", rid=0, prefix_len=32,
                      extend_len=32, chunk_requested=32, chunk_admitted=16, verdict="chunked"))
    p(2 * S // 10, "full", "alloc", 32, dur=1000)
    p(2 * S // 10, "swa", "alloc", 32, dur=3000)
    sched.append(dict(ts_ns=2 * S // 10, seq=next(seq), kind="step", forward_ct=1, mode="prefill",
                      step_ns=10_000))
    st(3 * S // 10, "full", 128, 96, 0, 32, 0)
    st(3 * S // 10, "swa", 64, 32, 0, 0, 32)
    sched.append(dict(ts_ns=S // 2, seq=next(seq), kind="admit", rid=0, prefix_len=48, extend_len=16,
                      chunk_requested=16, chunk_admitted=16, verdict="admitted"))
    p(S // 2, "full", "alloc", 16, dur=2000)
    sched.append(dict(ts_ns=S // 2, seq=next(seq), kind="step", forward_ct=2, mode="prefill",
                      step_ns=20_000))
    st(9 * S // 10, "full", 128, 80, 16, 32, 0)
    cache.append(dict(ts_ns=12 * S // 10, seq=next(seq), op="evict", full_tokens=16, swa_tokens=16,
                      tombstones=1))
    p(12 * S // 10, "full", "free", 16, dur=500)
    p(12 * S // 10, "swa", "free", 16, dur=500)
    st(13 * S // 10, "swa", 64, 48, 0, 0, 16)
    req.append(dict(ts_ns=15 * S // 10, seq=next(seq), event="finish", rid=0, session_id=5, input_len=64,
                    output_len=10, max_new_tokens=32, cached_len=32))
    # request 1 (session 5): arrives t=1.6, matched once, aborted without a finish row at t=2.5
    req.append(dict(ts_ns=16 * S // 10, seq=next(seq), event="arrival", rid=1, session_id=5, input_len=80,
                    output_len=-1, max_new_tokens=32, page_hashes=[11, 12, 13, 14, 15]))
    cache.append(dict(ts_ns=16 * S // 10, seq=next(seq), op="match", rid=1, device_hit=48, host_hit=16))
    sched.append(dict(ts_ns=2 * S + S // 10, seq=next(seq), kind="retract", rid=1))
    p(2 * S + S // 5, "full", "free", 32, dur=700)
    cache.append(dict(ts_ns=2 * S + S // 5, seq=next(seq), op="evict", full_tokens=64, swa_tokens=0))
    st(2 * S + S // 2, "full", 128, 128, 0, 0, 0)
    return {"pool": pool, "stats": stats, "cache": cache, "sched": sched, "request": req}


@pytest.fixture
def small_trace(tmp_path):
    return write_trace(tmp_path / "small", small_rows())
