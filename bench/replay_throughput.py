#!/usr/bin/env python3
"""Replay throughput of the real-code backend with the hooks on, and sweep scaling.

1. ``kvtrace replay`` of ``--workload`` (default ``data/workloads/production_1h``, about an hour
   of mixed traffic for one rank; ``make data`` writes it) under ``--policy``: simulated seconds
   per wall second, steps per second.
2. ``kvtrace sweep`` of ``--sweep-workload`` with 4 runs (baseline, swa-fixes x two
   ``max_running_requests``), once with ``--jobs 1`` and once with ``--jobs 2``, side by side in
   this process: the speedup of ``--jobs 2``.

Targets (issue #11): ``sim_s_per_wall_s`` >= 25, ``sweep_speedup_jobs2`` >= 1.7.

    bench/replay_throughput.py [--workload W] [--policy P] [--sweep-workload W2] [--skip-sweep] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure_replay(workload: Path, policy: str, sets: list[str]) -> dict:
    from replay.runs import replay_run

    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        t0 = time.perf_counter()
        s = replay_run(workload, Path(tmp) / "run", policy=policy, sets=sets, progress=sys.stderr.isatty())
        total = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (Path(tmp) / "run").rglob("*") if p.is_file())
    return {"workload": str(workload), "policy": policy, "requests": s.requests, "steps": s.steps,
            "sim_s": s.sim_s, "wall_s": s.wall_s, "total_wall_s": round(total, 3),
            "sim_s_per_wall_s": round(s.sim_s / s.wall_s, 2), "steps_per_s": round(s.steps / s.wall_s, 1),
            "run_mb": round(size / 1e6, 2)}


def measure_sweep(workload: Path, sets: list[str]) -> dict:
    from replay.runs.sweep import sweep

    out = {}
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        for jobs in (1, 2):
            t0 = time.perf_counter()
            df = sweep(workload, Path(tmp) / f"jobs{jobs}", policies=["baseline", "swa-fixes"],
                       grid=["max_running_requests=32,64"], sets=sets, jobs=jobs)
            out[f"sweep_wall_s_jobs{jobs}"] = round(time.perf_counter() - t0, 3)
            failed = df.filter(df["status"] != "ok").height
            if failed:
                raise SystemExit(f"sweep with --jobs {jobs}: {failed} runs failed")
    out["sweep_runs"] = 4
    out["sweep_speedup_jobs2"] = round(out["sweep_wall_s_jobs1"] / out["sweep_wall_s_jobs2"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=ROOT / "data/workloads/production_1h")
    ap.add_argument("--policy", default="swa-fixes")
    ap.add_argument("--set", action="append", default=[], help="knob KNOB=VALUE for the replay")
    ap.add_argument("--sweep-workload", type=Path, default=ROOT / "data/workloads/mixed")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not args.skip_replay and not (args.workload / "manifest.json").is_file():
        raise SystemExit(f"{args.workload}: no workload there; `make data` writes data/workloads/production_1h")
    res: dict = {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
    if not args.skip_replay:
        res |= measure_replay(args.workload, args.policy, args.set)
    if not args.skip_sweep:
        res |= measure_sweep(args.sweep_workload, [])
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
