"""How long ``kvtrace plan`` takes on an hour of traffic (issue 26 target: production_1h over >= 12
splits in <= 2 min wall on this 2-core machine; ``--confirm`` timed apart).

    python bench/plan_speed.py                     # data/workloads/production_1h, table
    python bench/plan_speed.py --json              # one JSON object
    python bench/plan_speed.py --confirm           # also the winner and neighbours on sglang

The plan runs as ``kvtrace plan`` runs it by default (``--early-stop on``: infeasible splits stop
at their first retraction or abort, the search ends once the curve has turned down or a split
reaches 99 % of the attainable hit ratio); ``--early-stop off`` replays every split of the 12
(infeasible ones still stop at their first retraction: ``--run-infeasible`` runs them out),
``--jobs`` at a time on the reference backend, into a fresh plan directory, the splits
figures-only as ``kvtrace plan`` runs them without ``--traces``, the sweep's zygote reading the
workload and keying its requests once for all splits (session 20: 114.2 and 115.2 s wall, 226-228
CPU s, 5 of 12 splits; the tree before it, acd942f, 136.3 s the same morning; docs/capacity.md
"Plan speed"; session 24 on a fresh, fast VM: 40.2 s at its start, 37.4 s (73.7 CPU s) after its
changes, and ``kvtrace plan`` itself on a fresh clone 39.9 s wall, peak RSS 1.36 GB). ``--json`` keys:
``wall_s``, ``cpu_s`` (this process and its finished children), ``splits`` (considered),
``splits_run``, ``splits_stopped`` (ended at a first retraction/abort), ``early_stop_reason``,
``s_per_split``, ``sim_s`` (the workload's simulated seconds of a whole split), ``realtime_x``
(simulated seconds replayed per wall second, all splits), ``best_ratio``, ``confirm_wall_s``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATIOS = (0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8)


def measure(workload: Path, *, kv_gb: float, model: str, jobs: int, confirm: bool, early_stop: bool = True,
            stop_infeasible: bool = True) -> dict:
    import os

    from replay.errors import DataLostError
    from replay.runs.plan import plan

    tmp = Path(tempfile.mkdtemp(prefix="kvtrace-bench-plan-"))
    try:
        t0, c0 = time.perf_counter(), os.times()
        res = plan(workload, tmp / "p", kv_gb=kv_gb, model=model, ratios=RATIOS, jobs=jobs, early_stop=early_stop,
                   stop_infeasible=stop_infeasible)
        wall = time.perf_counter() - t0
        c1 = os.times()
        cpu = (c1.user + c1.system + c1.children_user + c1.children_system
               - c0.user - c0.system - c0.children_user - c0.children_system)
        out = {"workload": str(workload), "kv_gb": kv_gb, "model": model, "jobs": jobs, "splits": len(RATIOS),
               "splits_run": len(res.rows), "splits_stopped": sum(r.get("status") == "stopped" for r in res.rows),
               "early_stop": early_stop, "early_stop_reason": res.early_stop_reason, "cpu_s": round(cpu, 1),
               "wall_s": round(wall, 1), "s_per_split": round(wall / max(1, len(res.rows)), 2),
               "best_ratio": res.best["swa_full_tokens_ratio"] if res.best else None,
               "rows": [{k: r.get(k) for k in ("swa_full_tokens_ratio", "full_pool_tokens", "swa_pool_tokens",
                                               "prefix_hit_ratio", "ttft_p99_ms", "retractions", "aborted",
                                               "status", "stopped_at_s", "feasible")}
                        for r in res.rows]}
        from replay.runs.summary import read_summary

        sims = [read_summary(r["run"]).sim_s for r in res.rows if r.get("status") in ("ok", "stopped")]
        out["sim_s"] = round(max(sims), 1) if sims else 0.0  # a whole split's (stopped ones are shorter)
        out["realtime_x"] = round(sum(sims) / wall, 1) if wall > 0 else 0.0
        if confirm and res.best:
            t1 = time.perf_counter()
            res2 = plan(workload, tmp / "p", kv_gb=kv_gb, model=model, ratios=RATIOS, jobs=jobs, early_stop=False,
                        confirm=True)
            out["confirm_wall_s"] = round(time.perf_counter() - t1, 1)
            out["confirm"] = res2.confirm
        return out
    except DataLostError as e:  # a full $TMPDIR: the sweep's "resume" advice does not hold for a temporary plan
        what = str(e).split("; the finished runs are kept")[0]
        raise DataLostError(f"{what}; the bench's plan directory was temporary and is removed: "
                            f"free space in {tmp.parent} and run it again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=Path, default=ROOT / "data" / "workloads" / "production_1h")
    ap.add_argument("--kv-gb", type=float, default=4.0, help="device KV budget (GB)")
    ap.add_argument("--model", default="mellum-like-swa", help="bytes per token preset (replay.models)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--confirm", action="store_true", help="also time --confirm (the real sglang backend)")
    ap.add_argument("--early-stop", choices=("on", "off"), default="on",
                    help="on: as kvtrace plan runs by default; off: every split (--no-early-stop)")
    ap.add_argument("--run-infeasible", action="store_true", help="run infeasible splits to their end")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not (args.workload / "manifest.json").is_file():
        hint = " (git-ignored: `make data` writes it)" if args.workload.name == "production_1h" else ""
        ap.exit(2, f"plan_speed.py: {args.workload}: not a workload or trace directory (no manifest.json){hint}\n")
    r = measure(args.workload, kv_gb=args.kv_gb, model=args.model, jobs=args.jobs, confirm=args.confirm,
                early_stop=args.early_stop == "on", stop_infeasible=not args.run_infeasible)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"plan {r['workload']}: {r['splits']} splits of {r['kv_gb']:g} GB ({r['model']}), {r['splits_run']} run "
          f"({r['splits_stopped']} stopped at a first retraction/abort; early stop "
          f"{r['early_stop_reason'] or ('none' if r['early_stop'] else 'off')}), {r['jobs']} jobs: "
          f"{r['wall_s']} s wall, {r['cpu_s']} CPU s ({r['s_per_split']} s per split, {r['realtime_x']}x real time over all splits); "
          f"best ratio {r['best_ratio']}" + (f"; --confirm {r['confirm_wall_s']} s" if "confirm_wall_s" in r else ""))
    print(f"{'ratio':>6} {'full':>9} {'swa':>8} {'hit':>6} {'ttft p99':>11} {'retract':>7} {'aborted':>7} status")
    for row in r["rows"]:
        st = (f"stopped at {row['stopped_at_s']:,.1f} s" if row["status"] == "stopped" else
              "feasible" if row["feasible"] else row["status"] or "")
        print(f"{row['swa_full_tokens_ratio']:>6g} {row['full_pool_tokens']:>9,} {row['swa_pool_tokens']:>8,} "
              f"{(row['prefix_hit_ratio'] or 0):>6.3f} {(row['ttft_p99_ms'] or 0):>11.1f} "
              f"{(row['retractions'] or 0):>7} {(row['aborted'] or 0):>7} {st}")
    return 0


if __name__ == "__main__":
    from replay.errors import Interrupted, KvtraceError

    try:
        sys.exit(main())
    except (Interrupted, KeyboardInterrupt) as e:  # Ctrl-C: inside the plan, or between its parts
        # (the plan's directory was temporary: nothing to resume)
        print(f"plan_speed.py: interrupted by {getattr(e, 'signal_name', 'SIGINT')} (no figures)", file=sys.stderr)
        sys.exit(130)
    except KvtraceError as e:  # a workload, model or knob refused: one line
        sys.exit(f"plan_speed.py: {e}")
