"""Replay speed of the two backends on the same workload: simulated seconds per wall second.

    python bench/replay_speed.py [--workload data/workloads/mixed] [--policy swa-fixes] [--set K=V ...] [--json]

Runs ``replay_run`` once per backend (reference first) into a temporary directory and prints
``reference_sim_s_per_wall_s``, ``sglang_sim_s_per_wall_s`` and their ``ratio`` (targets: ratio
>= 5, reference >= 50x real time on ``data/workloads/production_1h``). Wall time includes writing
the trace and computing the summary, as ``kvtrace replay`` does. On a shared machine the wall
figure measures the load as much as the backend, so each backend's CPU seconds (this process,
``time.process_time``) and simulated seconds per CPU second are printed beside it, and the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="data/workloads/mixed")
    ap.add_argument("--policy", default="swa-fixes")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--backends", default="reference,sglang")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from replay.runs.replay import replay_run

    out = {"workload": args.workload, "policy": args.policy, "sets": args.sets}
    with tempfile.TemporaryDirectory() as tmp:
        for be in args.backends.split(","):
            cpu0 = time.process_time()
            s = replay_run(args.workload, Path(tmp) / be, policy=args.policy, sets=args.sets, backend=be,
                           progress=False)
            cpu = time.process_time() - cpu0
            out[f"{be}_cpu_s"] = round(cpu, 3)
            out[f"{be}_sim_s_per_cpu_s"] = round(s.sim_s / cpu, 3) if cpu > 0 else None
            out[f"{be}_steps"] = s.steps
            out[f"{be}_sim_s"] = s.sim_s
            out[f"{be}_wall_s"] = s.wall_s
            out[f"{be}_sim_s_per_wall_s"] = round(s.sim_s_per_wall_s, 3)
            out[f"{be}_requests_finished"] = s.finished
    out["load_average"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    if "reference_sim_s_per_wall_s" in out and out.get("sglang_sim_s_per_wall_s"):
        out["ratio"] = round(out["reference_sim_s_per_wall_s"] / out["sglang_sim_s_per_wall_s"], 3)
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
