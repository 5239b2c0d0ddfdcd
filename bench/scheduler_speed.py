"""Steps per second of the sglang backend under sglang's own Scheduler and under the mirror.

Runs the same workload (first ``--requests`` arrivals) through ``scheduler=mirror`` and
``scheduler=real`` in one process, without the tracer, and reports steps/s of each (build time
excluded: the first real Scheduler of a process also pays sglang's scheduler imports) and the
ratio. ``--profile`` prints the top cProfile entries of the real run (where its time goes).

    .venv/bin/python bench/scheduler_speed.py --workload data/workloads/multi_turn --requests 40 --json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path
from time import perf_counter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(workload_dir: Path, num_requests: int, scheduler: str, sets: list[str], profile: bool = False) -> dict:
    """One run: build time, steps, run wall time, steps/s (and a cProfile summary if asked)."""
    import dataclasses

    from replay.backends.sglang import load_workload
    from replay.backends.sglang.loop import SglangBackend
    from replay.backends.sglang.settings import parse_overrides

    w = load_workload(workload_dir)
    if num_requests:
        w.__dict__["requests"] = w.requests[:num_requests]
    settings = dataclasses.replace(parse_overrides(sets), scheduler=scheduler)
    t0 = perf_counter()
    with SglangBackend(w, settings, debug_memory_pool=False) as be:
        t1 = perf_counter()
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        result = be.run()
        if prof:
            prof.disable()
        t2 = perf_counter()
    out = {"scheduler": scheduler, "requests": result.num_requests, "steps": result.num_steps,
           "build_s": round(t1 - t0, 3), "run_s": round(t2 - t1, 3),
           "steps_per_s": round(result.num_steps / (t2 - t1), 1) if t2 > t1 else 0.0}
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        out["profile"] = buf.getvalue()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=ROOT / "data/workloads/multi_turn")
    ap.add_argument("--requests", type=int, default=40, help="first N arrivals (0 = all)")
    ap.add_argument("--set", action="append", default=[], help="setting KEY=VALUE")
    ap.add_argument("--profile", action="store_true", help="cProfile the real Scheduler's run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    runs = {s: measure(a.workload, a.requests, s, a.set, profile=a.profile and s == "real")
            for s in ("mirror", "real")}
    ratio = runs["mirror"]["steps_per_s"] / runs["real"]["steps_per_s"] if runs["real"]["steps_per_s"] else None
    report = {"workload": str(a.workload), "mirror": runs["mirror"], "real": runs["real"],
              "real_slowdown_x": round(ratio, 2) if ratio else None}
    profile = runs["real"].pop("profile", None)
    if a.json:
        print(json.dumps(report))
    else:
        for s in ("mirror", "real"):
            r = runs[s]
            print(f"{s:6s} {r['steps']} steps in {r['run_s']} s: {r['steps_per_s']} steps/s (build {r['build_s']} s)")
        print(f"real Scheduler is {report['real_slowdown_x']}x slower than the mirror")
    if profile:
        print(profile, file=sys.stderr)
    return 0


if __name__ == "__main__":
    from replay.errors import KvtraceError

    try:
        raise SystemExit(main())
    except KvtraceError as e:  # a workload or knob refused: one line
        sys.exit(f"scheduler_speed.py: {e}")
