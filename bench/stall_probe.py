"""How long an emitting thread stalls while the recorder flushes (helpers of
``bench/tracer_overhead.py``; not a benchmark of its own).

A thread emits ``pool`` rows in a tight loop, in chunks of 100 emits (~20 us) each ending with
``tracer.tick()`` (a server's step boundary, where the drain process's hand-over happens), and
times the gap between chunks. Three figures per gap, so that what the tracer causes is told apart from what
the machine does anyway:

- the raw gap (``perf_counter``);
- the **stall**: the gap less the time the kernel kept the thread runnable but off a CPU inside
  it (run-queue delay, ``/proc/thread-self/schedstat``, exact at each switch-in). What is left is
  time the thread was blocked, or the whole VM was descheduled by its host (steal, not reported
  on this VM), or a page fault;
- whether the thread **blocked** inside the gap (its voluntary context switches,
  ``getrusage(RUSAGE_THREAD)``). This loop does no I/O and takes no lock: it can only block
  waiting for the GIL, i.e. while another thread of the process holds it -- the flusher thread,
  the cause the benchmark is about. A GIL wait whose holder is itself preempted (it waits for a
  CPU while holding the GIL) is counted whole: that is the stall the tracer adds.

``--contended`` runs two CPU-bound competitor processes. With three CPU-bound things on two
cores the emitting thread is descheduled for a scheduler slice every few ms whatever the tracer
does; that is run-queue delay and not counted as stall.
"""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tracer

CHUNK = 100  # emits between two clock reads


def busy_ticks() -> int:
    """Busy CPU ticks of the whole machine (all CPUs) since boot, from /proc/stat (0 elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4]  # minus idle and iowait
    except OSError:
        return 0


class RunDelay:
    """This thread's run-queue delay in ns (time runnable but not on a CPU), from
    ``/proc/thread-self/schedstat``; 0 where that file does not exist."""

    def __init__(self):
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def __call__(self) -> int:
        return int(os.pread(self.fd, 64, 0).split()[1]) if self.fd is not None else 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _voluntary_switches():
    """``() -> int``: this thread's voluntary context switches (0 where not measurable)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return lambda: 0
    get = resource.getrusage
    return lambda: get(who).ru_nvcsw


def gap_loop(pool, tick, seconds: float) -> dict:
    """Emit ``pool`` rows in ``CHUNK``-emit chunks, each followed by ``tick()``, for ``seconds``. Returns, in ns: ``stall``
    (longest gap less its run-queue delay), ``raw`` (longest gap), ``blocked`` (longest stall of
    a gap in which the thread blocked: a GIL wait), ``p99``/``p999`` (percentiles of the per-chunk
    stall), ``over_1ms`` (chunks whose stall exceeds 1 ms) and ``events``."""
    pc, run_delay, nvcsw = time.perf_counter_ns, RunDelay(), _voluntary_switches()
    stalls: list[int] = []
    add = stalls.append
    worst_raw = worst_blocked = i = 0
    end = pc() + int(seconds * 1e9)
    last, last_rd, last_v = pc(), run_delay(), nvcsw()
    try:
        while last < end:
            for _ in range(CHUNK):
                pool(0, 0, i, 64, 1, 0)
                i += 1
            tick()
            now, rd, v = pc(), run_delay(), nvcsw()
            gap = now - last
            s = gap - (rd - last_rd)
            add(s)
            if gap > worst_raw:
                worst_raw = gap
            if v != last_v and s > worst_blocked:
                worst_blocked = s
            last, last_rd, last_v = now, rd, v
    finally:
        run_delay.close()
    arr = np.asarray(stalls, np.int64)
    p99, p999 = np.percentile(arr, [99, 99.9]) if len(arr) else (0, 0)
    return {"stall": int(arr.max(initial=0)), "raw": worst_raw, "blocked": worst_blocked, "p99": float(p99),
            "p999": float(p999), "over_1ms": int((arr > 1_000_000).sum()), "events": i}


def traced_trial(out: Path, seconds: float, flusher: str) -> tuple[dict, int]:
    """``gap_loop`` while recording: the flusher flushes every 50 ms and rotates segments every
    ~2 MB (each rotation converts IPC -> Parquet, in the flusher thread or the drain process).
    Returns (gap figures, events dropped)."""
    rec = tracer.start(out, flusher=flusher, buffer_events=1 << 20, flush_interval_ms=50, poll_interval_ms=10,
                       segment_max_bytes=2 << 20)
    try:
        g = gap_loop(tracer.pool, tracer.tick, seconds)
    finally:
        tracer.stop()
    return g, rec.drops.total


def bench_stall(tmp: Path, seconds: float, trials: int, flusher: str) -> dict:
    """``trials`` stall trials, each followed by a baseline trial of the same loop with the
    recorder stopped. ``stall_other_cpu_s``: CPU time other processes used meanwhile (0 on a
    quiet machine); ``stall_drop_frac``: share of the tight loop's events that the flusher could
    not keep up with (counted in ``drops`` rows, as designed)."""
    traced, base, events, drops = [], [], 0, 0
    busy0, t0 = busy_ticks(), os.times()
    for k in range(trials):
        gc.collect()
        g, d = traced_trial(tmp / f"stall{k}", seconds, flusher)
        traced.append(g)
        events, drops = events + g["events"], drops + d
        base.append(gap_loop(tracer.pool, tracer.tick, seconds / 2))  # recorder stopped: no-op emits
    busy, t1 = busy_ticks() - busy0, os.times()
    mine = sum(t1[:4]) - sum(t0[:4])  # user, system, children user, children system (seconds)
    ms = lambda gs, key: [round(g[key] / 1e6, 3) for g in gs]  # noqa: E731
    return {"max_stall_ms": max(ms(traced, "stall")), "max_stall_ms_trials": ms(traced, "stall"),
            "max_blocked_ms": max(ms(traced, "blocked")), "p99_stall_ms": max(ms(traced, "p99")),
            "max_gap_ms_raw": max(ms(traced, "raw")), "max_gap_ms_raw_trials": ms(traced, "raw"),
            "max_gap_ms_baseline": max(ms(base, "raw")),
            # the same correction with the recorder stopped: what the machine alone does to the
            # loop beyond run-queue delay (hypervisor steal, interrupts, memory pressure)
            "max_stall_ms_baseline": max(ms(base, "stall")),
            "max_stall_ms_baseline_trials": ms(base, "stall"),
            "stall_drop_frac": drops / max(events, 1),
            "stall_other_cpu_s": max(busy / os.sysconf("SC_CLK_TCK") - mine, 0.0)}


MODES = ("off", "thread", "process")


def compare_stalls(tmp: Path, seconds: float, trials: int) -> dict:
    """Rounds of three trials of the same loop: recorder off (no-op emits), flusher thread,
    drain process; the order rotates every round so that neither mode gets the quieter moments.
    Per mode: ``<mode>_max_stall_ms`` (any gap, less run-queue delay), ``<mode>_max_blocked_ms``
    (gaps with a GIL wait: what a flusher adds; 0 with the recorder off), per-trial maxima,
    ``<mode>_p99_stall_ms``/``p999`` (largest over trials of the per-chunk percentile),
    ``<mode>_stalls_over_1ms_per_s``, ``<mode>_max_gap_ms_raw``, ``<mode>_drop_frac``; and
    ``<flusher>_stall_excess_ms``: the traced maximum stall less the untraced one (0 if below)."""
    res: dict[str, list] = {m: [] for m in MODES}
    drops = {m: 0 for m in MODES}
    for k in range(trials):
        for m in MODES[k % 3:] + MODES[: k % 3]:
            gc.collect()
            if m == "off":
                res[m].append(gap_loop(tracer.pool, tracer.tick, seconds))
            else:
                g, d = traced_trial(tmp / f"{m}{k}", seconds, m)
                res[m].append(g)
                drops[m] += d
    out: dict = {}
    for m, gs in res.items():
        ms = [round(g["stall"] / 1e6, 3) for g in gs]
        blk = [round(g["blocked"] / 1e6, 3) for g in gs]
        out.update({f"{m}_max_stall_ms": max(ms), f"{m}_max_stall_ms_trials": ms,
                    f"{m}_max_blocked_ms": max(blk), f"{m}_max_blocked_ms_trials": blk,
                    f"{m}_p99_stall_ms": max(g["p99"] for g in gs) / 1e6,
                    f"{m}_p999_stall_ms": max(g["p999"] for g in gs) / 1e6,
                    f"{m}_stalls_over_1ms_per_s": sum(g["over_1ms"] for g in gs) / (seconds * len(gs)),
                    f"{m}_max_gap_ms_raw": max(g["raw"] for g in gs) / 1e6,
                    f"{m}_events_per_s": sum(g["events"] for g in gs) / (seconds * len(gs))})
        if m != "off":
            out[f"{m}_drop_frac"] = drops[m] / max(sum(g["events"] for g in gs), 1)
    for m in MODES[1:]:
        out[f"{m}_stall_excess_ms"] = max(out[f"{m}_max_stall_ms"] - out["off_max_stall_ms"], 0.0)
    return out


def start_competitors(n: int = 2) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes (a Python busy loop each) competing for the cores."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_competitors(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()
