"""Tracer overhead, measured side by side in one run (this machine is noisy: compare ratios).

Rows:
- emit ns per family (hot path, inline loop; loop overhead included, as in measurements.md);
- a disabled emit and a no-op Python call with the same arguments;
- a KV-event-style publisher as vLLM/SGLang ship it (event objects, per-step batches, a
  ``queue.Queue``, a background thread doing msgpack encoding and a ZMQ PUB send, a subscriber
  draining in the same process), counted as total process CPU per event;
- the tracer counted the same way (emits + background flush, process CPU per event);
- flush throughput (swap + Arrow + IPC write, and Parquet compaction), bytes/event on disk for
  the ``pool`` family of a realistic stream, and the longest stall of an emitting thread while
  the flusher flushes and rotates, over ``--stall-trials`` trials (see ``bench/stall_probe.py``):
  ``max_stall_ms`` is the longest gap of any trial less the time the OS kept the thread waiting
  for a CPU inside that gap (run-queue delay); ``max_blocked_ms`` the longest such stall in which
  the thread blocked (a GIL wait: what a flusher thread causes); ``max_gap_ms_raw`` the longest
  gap as measured; ``max_gap_ms_baseline``/``max_stall_ms_baseline`` the same loop with the
  recorder stopped (what this machine does alone).

``--contended`` runs two CPU-bound competitor processes (``while True: pass``) for the whole
benchmark, as a server's scheduler shares its cores with tokenizers, detokenizers and other
ranks, and compares side by side: the emit cost with each flusher (wall and thread-CPU ns), and
rounds of stall trials with the recorder off, the flusher thread and the drain process
(``stall_probe.compare_stalls``), with the load average before and after. Its headline
``max_stall_ms`` is the stall the ``--flusher`` adds: ``<flusher>_max_blocked_ms``.
``--flusher`` picks the recorder's flusher otherwise ("process": the drain process of
``tracer.drain``; "thread": the in-process flusher thread); ``--stall-only`` measures only the
stall trials.

Usage: python bench/tracer_overhead.py [--json] [--events N] [--stall-trials K] [--stall-seconds S]
       [--contended] [--flusher process|thread] [--stall-only]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import tracer
from tracer.recorder import RecorderOptions
from tracer.schema import Pool, PoolOp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stall_probe import bench_stall, compare_stalls, start_competitors, stop_competitors  # noqa: E402

FLUSHER = [RecorderOptions().flusher]  # set by --flusher; passed to every tracer.start here

_CALLS = {
    "pool": "tracer.pool(0, 0, i, 64, 1, 0)",
    "cache": "tracer.cache(0, i, 1024, 128, 64)",  # a match row: op, rid and the three hits
    "cache_full_row": "tracer.cache(2, i, 0, 0, 0, 64, 64, 0, 3, 1, 900)",  # every column set
    "sched": "tracer.sched(1, i, 2, 32, 32, 9000)",
    "stats": "tracer.stats(i, 1, 65536, 1000, 2000, 3000, 4000)",
    "request": "tracer.request(0, i, 3, 1, 900, 100, 128, -1, 'r', None)",
}


def _loop_ns(body: str, n: int, repeats: int, env: dict | None = None, clock=time.perf_counter_ns) -> float:
    """Median ns per iteration of ``for i in range(n): body`` (compiled inline). Buffers are
    flushed between runs, outside the timed loop, so a run never overflows into drops.
    ``clock``: ``time.thread_time_ns`` counts only this thread's CPU time (a contended machine
    deschedules the loop; wall time would count the waits)."""
    src = f"def f(n):\n    t0 = pc()\n    for i in range(n):\n        {body}\n    return pc() - t0\n"
    ns = {"tracer": tracer, "pc": clock, **(env or {})}
    exec(src, ns)
    ns["f"](min(n, 10_000))  # warm-up
    runs = []
    for _ in range(repeats):
        tracer.flush()
        gc.collect()
        runs.append(ns["f"](n) / n)
    return statistics.median(runs)


def bench_emits(tmp: Path, n: int, repeats: int) -> dict:
    def noop(a, b, c, d, e, f):
        return None

    out = {"noop_call_ns": _loop_ns("noop(0, 0, i, 64, 1, 0)", n, repeats, {"noop": noop}),
           "emit_ns_disabled": _loop_ns(_CALLS["pool"], n, repeats)}
    rec = tracer.start(flusher=FLUSHER[0], out_dir=tmp / "emit", buffer_events=max(n + 10_000, 1 << 16),
                       row_buffer_events=max(n + 10_000, 1 << 16), flush_interval_ms=60_000,
                       poll_interval_ms=60_000)
    for name, call in _CALLS.items():
        out[f"emit_ns_{name}"] = _loop_ns(call, n, repeats)
    tracer.stop()
    if rec.drops.total:
        raise RuntimeError(f"emit timing: {rec.drops.total} events dropped; the figures would be wrong")
    return out


def bench_emit_flushers(tmp: Path, n: int, repeats: int) -> dict:
    """``pool`` and ``cache`` emit ns with each flusher, wall and thread-CPU, side by side."""
    out = {"emit_ns_disabled": _loop_ns(_CALLS["pool"], n, repeats),
           "emit_cpu_ns_disabled": _loop_ns(_CALLS["pool"], n, repeats, clock=time.thread_time_ns)}
    for flusher in ("thread", "process"):
        rec = tracer.start(flusher=flusher, out_dir=tmp / f"emit-{flusher}", buffer_events=max(n + 10_000, 1 << 16),
                           flush_interval_ms=60_000, poll_interval_ms=60_000)
        for name in ("pool", "cache"):
            out[f"{flusher}_emit_ns_{name}"] = _loop_ns(_CALLS[name], n, repeats)
            out[f"{flusher}_emit_cpu_ns_{name}"] = _loop_ns(_CALLS[name], n, repeats, clock=time.thread_time_ns)
        tracer.stop()
        if rec.drops.total:
            raise RuntimeError(f"emit timing: {rec.drops.total} events dropped; the figures would be wrong")
    return out


# ------------------------------------------------------------------------------------------
# KV-event-style publisher (the shape vLLM and SGLang ship: objects -> queue -> thread -> ZMQ)
# ------------------------------------------------------------------------------------------
class BlockStored:
    __slots__ = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")

    def __init__(self, block_hashes, parent_block_hash, token_ids, block_size, lora_id):
        self.block_hashes = block_hashes
        self.parent_block_hash = parent_block_hash
        self.token_ids = token_ids
        self.block_size = block_size
        self.lora_id = lora_id


def bench_publisher(n: int, batch: int = 256) -> float:
    """Total process CPU ns per event until the publisher thread has sent everything."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 100_000)
    pub.bind("inproc://kv-events")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 100_000)
    sub.connect("inproc://kv-events")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    time.sleep(0.05)
    q: queue.Queue = queue.Queue()
    received = [0]

    def publisher():
        packer, seq = msgpack.Packer(), 0
        while True:
            item = q.get()
            if item is None:
                pub.send_multipart([b"", b"END"])
                return
            ts, events = item
            payload = packer.pack([ts, [[e.block_hashes, e.parent_block_hash, e.token_ids,
                                         e.block_size, e.lora_id] for e in events]])
            seq += 1
            pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def subscriber():
        while True:
            frames = sub.recv_multipart()
            if frames[1] == b"END":
                return
            received[0] += 1

    ts = [threading.Thread(target=publisher), threading.Thread(target=subscriber)]
    for t in ts:
        t.start()
    c0 = time.process_time_ns()
    step: list = []
    for i in range(n):
        step.append(BlockStored([i], i - 1, None, 64, None))
        if len(step) == batch:
            q.put((time.time(), step))
            step = []
    q.put((time.time(), step))
    q.put(None)
    for t in ts:
        t.join()
    cpu = time.process_time_ns() - c0
    pub.close(0)
    sub.close(0)
    ctx.term()
    return cpu / n


def bench_tracer_total(tmp: Path, n: int) -> float:
    """Total process CPU ns per pool event: emits plus the background flush to disk and the
    Parquet compaction at stop (buffer sized so that nothing is dropped), the drain process's
    CPU included with ``--flusher process`` (note: its start-up, ~pyarrow import, is counted)."""
    rec = tracer.start(flusher=FLUSHER[0], out_dir=tmp / "total", flush_interval_ms=100, buffer_events=max(n, 1 << 16))
    c0, k0 = time.process_time_ns(), os.times()
    for i in range(n):
        tracer.pool(0, 0, i, 64, 1, 0)
    tracer.stop()  # reaps the drain process (flusher="process"): its CPU counts below
    k1 = os.times()
    cpu = time.process_time_ns() - c0 + int((k1.children_user + k1.children_system
                                             - k0.children_user - k0.children_system) * 1e9)
    if rec.drops.total:
        raise RuntimeError(f"tracer_total: {rec.drops.total} events dropped; enlarge the buffer")
    return cpu / n


# ------------------------------------------------------------------------------------------
# Realistic pool stream, flush throughput, bytes/event
# ------------------------------------------------------------------------------------------
def realistic_stream(n: int, seed: int = 0):
    """Yields emit calls of a plausible SWA + HiCache server at page_size 64 (about ``n`` events).

    ~256 running requests; per step one decode page alloc per request crossing a page boundary,
    prefill allocs on both device pools, out-of-window SWA frees, frees at finish, host backup
    allocs/frees with measured durations.
    """
    rng = np.random.default_rng(seed)
    running: dict[int, int] = {}
    next_rid, step, emitted = 0, 0, 0
    while emitted < n:
        step += 1
        yield ("tick",)
        while len(running) < 256:
            plen = int(rng.lognormal(7.0, 1.0)) + 1
            pages = -(-plen // 64)
            yield ("pool", Pool.FULL, PoolOp.ALLOC, next_rid, pages * 64, pages, 0)
            yield ("pool", Pool.SWA, PoolOp.ALLOC, next_rid, min(pages, 3) * 64, min(pages, 3), 0)
            running[next_rid] = plen
            next_rid += 1
            emitted += 2
        for rid in list(running):
            running[rid] += 1
            if running[rid] % 64 == 1:
                yield ("pool", Pool.FULL, PoolOp.ALLOC, rid, 64, 1, 0)
                yield ("pool", Pool.SWA, PoolOp.ALLOC, rid, 64, 1, 0)
                emitted += 2
            if running[rid] % 256 == 0:
                yield ("pool", Pool.SWA, PoolOp.FREE, rid, 128, 2, 0)
                emitted += 1
            if rng.random() < 0.004:
                pages = -(-running.pop(rid) // 64)
                yield ("pool", Pool.SWA, PoolOp.FREE, rid, 192, 3, 0)
                yield ("pool", Pool.FULL, PoolOp.FREE, rid, pages * 64, pages, 0)
                if rng.random() < 0.5:
                    yield ("pool", Pool.HOST_FULL, PoolOp.ALLOC, rid, pages * 64, pages,
                           int(rng.lognormal(8.5, 0.4)))
                    yield ("pool", Pool.HOST_FULL, PoolOp.FREE, -1, 64, 1, int(rng.lognormal(8.0, 0.4)))
                    emitted += 2
                emitted += 2


def _replay_calls(calls) -> None:
    pool = tracer.pool
    for c in calls:
        if c[0] == "tick":
            tracer.tick()
        else:
            pool(*c[1:])


def bench_flush_and_bytes(tmp: Path, n: int) -> dict:
    calls = list(realistic_stream(n))
    tracer.start(flusher=FLUSHER[0], out_dir=tmp / "real", buffer_events=1 << 21, flush_interval_ms=60_000, poll_interval_ms=60_000,
                 segment_max_bytes=1 << 40)
    rec = tracer.active()
    _replay_calls(calls)
    num = rec.structs["pool"].reserved(rec.structs["pool"].cur[0])
    t0 = time.perf_counter_ns()
    rec.flush(force=True)
    t1 = time.perf_counter_ns()
    tracer.stop()  # closes the segment: IPC -> Parquet compaction
    t2 = time.perf_counter_ns()
    files = list((tmp / "real" / "pool").rglob("*.parquet"))
    size = sum(f.stat().st_size for f in files)
    return {
        "pool_events": num,
        "flush_events_per_s": num / ((t1 - t0) / 1e9),
        "compact_events_per_s": num / ((t2 - t1) / 1e9),
        "flush_and_compact_events_per_s": num / ((t2 - t0) / 1e9),
        "bytes_per_event_pool": size / num,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--events", type=int, default=300_000, help="events per timing loop")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--stall-seconds", type=float, default=2.0, help="length of one stall trial")
    ap.add_argument("--stall-trials", type=int, default=5)
    ap.add_argument("--contended", action="store_true",
                    help="run two CPU-bound competitor processes during the benchmark")
    ap.add_argument("--flusher", choices=("process", "thread"), default=RecorderOptions().flusher,
                    help="recorder flusher (default: RecorderOptions' default)")
    ap.add_argument("--stall-only", action="store_true", help="only the stall trials")
    args = ap.parse_args()
    FLUSHER[0] = args.flusher
    tmp = Path(tempfile.mkdtemp(prefix="kvtrace-bench-"))
    r = {"flusher": args.flusher, "cpus": os.cpu_count(), "loadavg_1m_start": os.getloadavg()[0]}
    competitors = start_competitors(2) if args.contended else []
    r["competitors"] = len(competitors)
    try:
        if args.contended:
            if not args.stall_only:
                r.update(bench_emit_flushers(tmp, args.events, args.repeats))
            r.update(compare_stalls(tmp, args.stall_seconds, args.stall_trials))
            r["max_stall_ms"] = r[f"{args.flusher}_max_blocked_ms"]  # the stall this flusher adds
        elif args.stall_only:
            r.update(bench_stall(tmp, args.stall_seconds, args.stall_trials, args.flusher))
        else:
            r.update(bench_emits(tmp, args.events, args.repeats))
            r["publisher_ns"] = bench_publisher(args.events)
            r["tracer_total_ns_pool"] = bench_tracer_total(tmp, args.events)
            r["ratio_publisher_over_emit"] = r["publisher_ns"] / r["emit_ns_pool"]
            r["ratio_publisher_over_tracer_total"] = r["publisher_ns"] / r["tracer_total_ns_pool"]
            r.update(bench_flush_and_bytes(tmp, 1_000_000))
            r.update(bench_stall(tmp, args.stall_seconds, args.stall_trials, args.flusher))
    finally:
        stop_competitors(competitors)
        shutil.rmtree(tmp, ignore_errors=True)
    r["loadavg_1m_end"] = os.getloadavg()[0]
    _report(r, args.json)


def _report(r: dict, as_json: bool) -> None:
    r = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
    if as_json:
        print(json.dumps(r))
        return
    targets = {"emit_ns_pool": "<= 250", "emit_ns_cache": "<= 250", "emit_ns_disabled": "<= 60",
               "ratio_publisher_over_emit": ">= 2.5", "bytes_per_event_pool": "<= 10",
               "flush_events_per_s": ">= 2e6", "max_stall_ms": "<= 5",
               "thread_emit_ns_pool": "<= 250", "process_emit_ns_pool": "<= 250",
               "thread_emit_ns_cache": "<= 250", "process_emit_ns_cache": "<= 250",
               "process_max_blocked_ms": "<= 5", "thread_max_blocked_ms": "<= 5"}
    print(f"{'figure':<34} {'value':>16}  target")
    for k, v in r.items():
        if isinstance(v, str):
            print(f"{k:<34} {v:>16}")
            continue
        if isinstance(v, list):
            print(f"{k:<34} {' '.join(f'{x:.2f}' for x in v):>16}")
            continue
        print(f"{k:<34} {v:>16,.2f}  {targets.get(k, '')}")


if __name__ == "__main__":
    main()
