#!/usr/bin/env python3
"""Replay throughput of the real-code backend with the hooks on, and sweep scaling.

1. ``kvtrace replay`` of ``--workload`` (default ``data/workloads/production_1h``, about an hour
   of mixed traffic for one rank; ``make data`` writes it) under ``--policy``: simulated seconds
   per wall second, steps per second. ``--slice-s N`` replays only the arrivals of the first N
   simulated seconds (written to a temporary workload; the run still drains them): a quick
   iteration figure, e.g. ``--slice-s 300 --skip-sweep --schedulers ''``.
2. ``kvtrace sweep`` of ``--sweep-workload`` with 4 runs (baseline, swa-fixes x two
   ``max_running_requests``), once with ``--jobs 1`` and once with ``--jobs 2``, side by side in
   this process: the speedup of ``--jobs 2``.
3. ``--schedulers mirror,real`` (the default): ``kvtrace replay`` of ``--schedulers-workload``
   (default ``data/workloads/mixed``) once per sglang scheduler (knob ``scheduler``), side by
   side in this process: ``sched_<name>_steps_per_s`` (steps over the loop's step time, hooks
   on, build excluded) and ``real_slowdown_x`` (mirror steps/s over real steps/s; issue #16 wants
   <= 2). ``--repeat N`` interleaves N rounds and keeps each scheduler's fastest; ``--profile``
   prints the first round's top cProfile entries to stderr. ``--schedulers ''`` skips it.

4. ``--hooks-off``: the same replay of ``--workload`` with no hook and no recorder
   (``hooks_off_sim_s_per_wall_s``, ``hooks_off_steps_per_s``; build included): what sglang's own
   loop allows, the ceiling of the hooked figure.

Targets (issue #11): ``sim_s_per_wall_s`` >= 25, ``sweep_speedup_jobs2`` >= 1.7.

    bench/replay_throughput.py [--workload W] [--slice-s N] [--policy P] [--sweep-workload W2] [--skip-sweep]
                               [--schedulers mirror,real] [--schedulers-workload W3] [--profile] [--hooks-off] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_slice(workload: Path, seconds: float, out: Path) -> Path:
    """Write the arrivals of ``workload``'s first ``seconds`` simulated seconds as a workload."""
    import numpy as np

    from replay.workloads import RequestColumns, read_workload, write_workload

    w = read_workload(workload)
    c = w.columns
    n = int(np.searchsorted(c.ts_ns, int(c.ts_ns.min()) + int(seconds * 1e9), side="right"))
    off = c.hash_offsets[: n + 1]
    cols = RequestColumns(ts_ns=c.ts_ns[:n], session_id=c.session_id[:n], turn=c.turn[:n],
                          input_len=c.input_len[:n], output_len=c.output_len[:n],
                          max_new_tokens=c.max_new_tokens[:n], page_hashes=c.page_hashes[: off[-1]],
                          hash_offsets=off, rid_str=c.rid_str[:n] if c.rid_str else None,
                          rid=None if c.rid is None else c.rid[:n])
    meta = dict(w.manifest.get("workload", {}), slice_of=str(workload), slice_s=seconds)
    return write_workload(out, cols, w.hash_block_tokens, meta, page_hash=w.page_hash)


def measure_replay(workload: Path, policy: str, sets: list[str], slice_s: float = 0.0) -> dict:
    from replay.runs import replay_run

    source = workload
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        if slice_s > 0:
            workload = write_slice(workload, slice_s, Path(tmp) / "slice")
        t0 = time.perf_counter()
        s = replay_run(workload, Path(tmp) / "run", policy=policy, sets=sets, progress=sys.stderr.isatty())
        total = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (Path(tmp) / "run").rglob("*") if p.is_file())
    return {"workload": str(source), "policy": policy, "requests": s.requests, "steps": s.steps,
            "sim_s": s.sim_s, "wall_s": s.wall_s, "total_wall_s": round(total, 3),
            "sim_s_per_wall_s": round(s.sim_s / s.wall_s, 2), "steps_per_s": round(s.steps / s.wall_s, 1),
            "run_mb": round(size / 1e6, 2), "loop_s": round(s.sched_cpu_ns / 1e9, 3),
            "steps_per_loop_s": round(s.steps / (s.sched_cpu_ns / 1e9), 1), "slice_s": slice_s}


def measure_code(workload: Path, code: str, sets: list[str], slice_s: float = 0.0) -> dict:
    """Per-step speed of ``code``'s backend (its own process) against the installed 0.5.23 backend
    (``scheduler=real``, this process), same workload and sizes, policy ``recorded``, one run each.

    ``*_loop_us_per_step``: the loop's measured CPU per step (``sched_cpu_ns / steps``: scheduling
    and memory code with the hooks, what a step costs); ``*_wall_us_per_step``: the run's wall time
    (the code's build included, its process start not) per step; ``code_over_sglang_loop``: the
    ratio of the first (issue 24's target: <= 1.5).
    """
    from replay.runs import replay_run

    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-code-") as tmp:
        if slice_s > 0:
            workload = write_slice(workload, slice_s, Path(tmp) / "slice")
        out: dict = {"code": code, "code_workload": str(workload)}
        for name, kw in (("sglang", {}), ("code", {"code": code})):
            t0 = time.perf_counter()
            s = replay_run(workload, Path(tmp) / name, policy="recorded", sets=sets, **kw)
            out |= {f"{name}_steps": s.steps, f"{name}_finished": s.finished,
                    f"{name}_total_wall_s": round(time.perf_counter() - t0, 3), f"{name}_wall_s": s.wall_s,
                    f"{name}_loop_us_per_step": round(s.sched_cpu_ns / 1e3 / max(s.steps, 1), 1),
                    f"{name}_wall_us_per_step": round(s.wall_s * 1e6 / max(s.steps, 1), 1)}
            if kw:
                out["code_target"] = s.code.get("target")
    out["code_over_sglang_loop"] = round(out["code_loop_us_per_step"] / out["sglang_loop_us_per_step"], 3)
    out["code_over_sglang_wall"] = round(out["code_wall_us_per_step"] / out["sglang_wall_us_per_step"], 3)
    return out


def measure_schedulers(workload: Path, policy: str, sets: list[str], schedulers: list[str],
                       profile: bool = False, repeat: int = 1) -> dict:
    """Replay ``workload`` once per sglang scheduler, ``repeat`` rounds interleaved, in this
    process: steps/s of each over its fastest round (a shared machine's load only slows)."""
    import cProfile
    import io
    import pstats

    from replay.runs import replay_run

    out: dict = {"sched_workload": str(workload)}
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        for i, name in ((i, n) for i in range(repeat) for n in schedulers):
            prof = cProfile.Profile() if profile and i == 0 else None
            if prof:
                prof.enable()
            s = replay_run(workload, Path(tmp) / f"{name}{i}", policy=policy, sets=[*sets, f"scheduler={name}"])
            if prof:
                prof.disable()
                buf = io.StringIO()
                st = pstats.Stats(prof, stream=buf)
                st.sort_stats("cumulative").print_stats(r"replay|tracer|sglang/srt", 30)
                st.sort_stats("tottime").print_stats(20)
                print(f"--- cProfile, scheduler={name} ---\n{buf.getvalue()}", file=sys.stderr)
            # steps/s over the loop's own step time (sched_cpu_ns: every step, hooks included);
            # wall_s also holds building the backend (the first real Scheduler of a process
            # pays sglang's scheduler imports) and closing the recording.
            if i and s.sched_cpu_ns / 1e9 >= out[f"sched_{name}_loop_s"]:
                continue  # keep the fastest round
            out[f"sched_{name}_steps"] = s.steps
            out[f"sched_{name}_loop_s"] = round(s.sched_cpu_ns / 1e9, 3)
            out[f"sched_{name}_wall_s"] = s.wall_s
            out[f"sched_{name}_steps_per_s"] = round(s.steps / (s.sched_cpu_ns / 1e9), 1)
    if {"mirror", "real"} <= set(schedulers):
        out["real_slowdown_x"] = round(out["sched_mirror_steps_per_s"] / out["sched_real_steps_per_s"], 2)
    return out


def measure_sweep(workload: Path, sets: list[str]) -> dict:
    """``--jobs 1`` then ``--jobs 2`` over 4 runs: wall seconds, speedup, and where the time went
    (the parent's CPU; the zygote's import; per run, summed: its process's import, run and CPU)."""
    from replay.runs.sweep import sweep

    out = {}
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        for jobs in (1, 2):
            t0, cpu0 = time.perf_counter(), time.process_time()
            df = sweep(workload, Path(tmp) / f"jobs{jobs}", policies=["baseline", "swa-fixes"],
                       grid=["max_running_requests=32,64"], sets=sets, jobs=jobs)
            out[f"sweep_wall_s_jobs{jobs}"] = round(time.perf_counter() - t0, 3)
            out[f"sweep_parent_cpu_s_jobs{jobs}"] = round(time.process_time() - cpu0, 3)
            failed = df.filter(df["status"] != "ok").height
            if failed:
                raise SystemExit(f"sweep with --jobs {jobs}: {failed} runs failed")
            partial = Path(tmp) / f"jobs{jobs}" / ".partial"
            zygote = partial / "zygote.json"
            if zygote.is_file():
                z = json.loads(zygote.read_text())
                out[f"sweep_zygote_import_s_jobs{jobs}"] = z.get("import_s")
                out[f"sweep_zygote_import_cpu_s_jobs{jobs}"] = z.get("import_cpu_s")
            timings = [json.loads(p.read_text()).get("timing", {}) for p in sorted(partial.glob("*.result.json"))]
            for key in ("import_s", "replay_s", "record_s", "cpu_s"):
                out[f"sweep_runs_{key}_jobs{jobs}"] = round(sum(t.get(key, 0.0) for t in timings), 3)
    out["sweep_runs"] = 4
    out["sweep_speedup_jobs2"] = round(out["sweep_wall_s_jobs1"] / out["sweep_wall_s_jobs2"], 3)
    return out


def _seconds(text: str) -> float:
    """``--slice-s``: a finite number of seconds >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of seconds >= 0 (0: the whole workload)")
    return v


def measure_hooks_off(workload: Path, policy: str, sets: list[str], slice_s: float = 0.0) -> dict:
    """The same replay with no hook and no recorder: the real backend's loop alone (sglang's own
    per-step code and our stand-ins), the ceiling of ``sim_s_per_wall_s`` with the hooks on."""
    from replay.backends.sglang import SglangBackend
    from replay.runs.replay import backend_module, resolve_settings
    from replay.workloads import read_workload

    values, _assumed = resolve_settings(workload, policy, sets)
    settings = backend_module("sglang").settings_from_knobs(values)
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        source = write_slice(workload, slice_s, Path(tmp) / "slice") if slice_s > 0 else workload
        wl = read_workload(source)
        t0, c0 = time.perf_counter(), time.thread_time()
        with SglangBackend(wl, settings, debug_memory_pool=False) as be:
            res = be.run()
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    sim_s = max(0, res.clock_ns - wl.requests[0].arrival_ns) / 1e9
    return {"hooks_off_steps": res.num_steps, "hooks_off_sim_s": round(sim_s, 3),
            "hooks_off_wall_s": round(wall, 3), "hooks_off_cpu_s": round(cpu, 3),
            "hooks_off_sim_s_per_wall_s": round(sim_s / wall, 2),
            "hooks_off_steps_per_s": round(res.num_steps / wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=ROOT / "data/workloads/production_1h")
    ap.add_argument("--slice-s", type=_seconds, default=0.0,
                    help="replay only the arrivals of the first N simulated seconds of --workload (0: all)")
    ap.add_argument("--policy", default="swa-fixes")
    ap.add_argument("--set", action="append", default=[], help="knob KNOB=VALUE for the replay")
    ap.add_argument("--sweep-workload", type=Path, default=ROOT / "data/workloads/mixed")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--hooks-off", action="store_true",
                    help="also replay --workload with no hook or recorder (build included): the ceiling")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--schedulers", default="mirror,real",
                    help="sglang schedulers to replay side by side (comma list; '' skips)")
    ap.add_argument("--schedulers-workload", type=Path, default=ROOT / "data/workloads/mixed")
    ap.add_argument("--profile", action="store_true", help="cProfile each scheduler's replay (stderr)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds of the scheduler runs (best kept)")
    ap.add_argument("--code", default=None, metavar="SPEC",
                    help="only: per-step speed of SPEC's backend (e.g. the fork's tarball) against the 0.5.23 "
                         "backend on --workload (policy recorded, --set sizes), one run each")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.code:
        res = {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
        res |= measure_code(args.workload, args.code, args.set, args.slice_s)
        res["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
        print(json.dumps(res) if args.json else "\n".join(f"{k}  {v}" for k, v in res.items()))
        return 0
    if (not args.skip_replay or args.hooks_off) and not (args.workload / "manifest.json").is_file():
        raise SystemExit(f"{args.workload}: no workload there; `make data` writes data/workloads/production_1h")
    res: dict = {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
    if not args.skip_replay:
        res |= measure_replay(args.workload, args.policy, args.set, args.slice_s)
    if args.hooks_off:
        res |= measure_hooks_off(args.workload, args.policy, args.set, args.slice_s)
    if not args.skip_sweep:
        res |= measure_sweep(args.sweep_workload, [])
    schedulers = [x.strip() for x in args.schedulers.split(",") if x.strip()]
    if schedulers:
        res |= measure_schedulers(args.schedulers_workload, args.policy, args.set, schedulers, args.profile,
                                  max(1, args.repeat))
    res["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(res))
        return 0
    width = max(map(len, res))
    print(f"{'figure':<{width}}  value")
    for k, v in res.items():
        print(f"{k:<{width}}  {v:,}" if isinstance(v, (int, float)) else f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
