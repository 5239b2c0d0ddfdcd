"""A speed change to the reference backend, measured side by side: this tree against a git ref.

    python bench/replay_ab.py --base REF [--workload W] [--policy P] [--set K=V ...]
        [--requests N] [--rounds R] [--json]

``REF`` (a commit, tag or branch of this repository) is exported into a temporary directory
(``git archive``, no checkout touched). Each round runs the same recorded replay
(``replay_run``, the reference backend, as ``kvtrace replay`` runs it) once on each tree, both
processes at the same time (one per core of a 2-core machine), so the machine's load and drift
weigh on both alike: on a shared VM only such side-by-side figures compare (a 10M-iteration
Python loop took 1.5 s one day and 3.9 s another here). ``--requests`` replays the workload's
first N arrivals only.

Printed (``--json``: one object): each tree's CPU seconds per round (``process_time`` of its
process, the loop, the recorder's flusher, the summary, plus the CPU of the processes it reaped:
a run's key stream, ``replay.backends.reference.keystream``) and wall seconds, ``cpu_ratio`` (base
over head, the median over rounds: above 1, this tree is faster), and ``identical``: whether the
two runs wrote the same rows, family by family in ``seq`` order with the measured columns
(``dur_ns``, ``step_ns``, ``cpu_ns``, ``wall_ns``) left out, with the first difference otherwise
(``--detail figures``: figures-only runs, as a plan's splits, and their summaries compared, every
figure but the measured CPU and wall times).
A speed change to the model must keep ``identical`` true.

``--instructions`` runs each side under valgrind's callgrind instead (needs ``valgrind`` and
``callgrind_control`` on PATH), counting the instructions the replay itself executes
(``replay_run``: the workload read, the loop, the summary; not a key stream's process, which runs
beside it): ``base_instructions``, ``head_instructions`` and ``instructions_ratio`` (base over
head). The count does not move with the machine's load (two runs of a tree agree within 0.05 %),
so one round decides what the CPU figures cannot on a noisy VM (a change of 2-5 % there reads
anywhere from 0.95x to 1.2x). Instructions are not time (cache misses are not counted), but the
replay's time is the interpreter's: its changes this session read the same way on both where the
CPU figures could tell. Under callgrind a run takes ~50x longer: use ``--requests`` (production_1h's
first 1500 arrivals: ~9.2 G instructions, ~90 s a side).

Each side's process dies with the bench (``replay.procs.die_with_parent``): Ctrl-C, SIGTERM or
kill -9 of the bench leaves no replay or valgrind running (after kill -9 its temporary directory
stays in /tmp, as any SIGKILLed ``TemporaryDirectory``).

Measured 2026-12-04 (session 18), production_1h at the plan's best split (``--set
full_pool_tokens=225008 --set swa_pool_tokens=18000 --set stop_on_retraction=on``), base
``a954019`` (before the session's speed changes): see docs/capacity.md "Session 18".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEASURED = {"dur_ns", "step_ns", "cpu_ns", "wall_ns"}

# The child: one recorded replay on the tree at argv[1]; prints one JSON line.
_CHILD = r"""
import json, resource, sys, time
MEASURED = {"wall_s", "sched_cpu_ns", "host_alloc_cpu_ns", "host_free_cpu_ns", "run", "timing"}
root, out, source, policy, n, detail = sys.argv[1:7]
sets = sys.argv[7:]
sys.path.insert(0, root)
import replay
assert replay.__file__.startswith(root), replay.__file__
try:  # killed with the bench (kill -9 included), not left running orphaned
    import signal
    from replay.procs import die_with_parent
    die_with_parent(signal.SIGKILL)
except ImportError:  # a base tree older than it
    pass
import replay.workloads as workloads
if int(n):
    read = workloads.read_workload
    def first(*a, **k):
        wl = read(*a, **k)
        wl.__dict__["requests"] = wl.requests[:int(n)]  # a cached property
        return wl
    workloads.read_workload = first
from replay.runs.replay import replay_run
import os, subprocess
counted = bool(os.environ.get("KVTRACE_AB_CALLGRIND"))
def count(on):  # callgrind counts the replay only (``--instructions``)
    if counted:
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True)
def cpu():  # this process and the children it reaped (a run's key stream, a flusher process)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime
cpu0, t0 = cpu(), time.perf_counter()
if counted:  # a warm-up of 3 requests first: the lazy imports and their bytecode are not counted
    _read = workloads.read_workload
    def _tiny(*a, **k):
        wl = _read(*a, **k)
        wl.__dict__["requests"] = wl.requests[:3]
        return wl
    workloads.read_workload = _tiny
    replay_run(source, out + "-warm", policy=policy, sets=sets, backend="reference", detail=detail)
    workloads.read_workload = _read
count(True)
s = replay_run(source, out, policy=policy, sets=sets, backend="reference", detail=detail)
count(False)
print(json.dumps({"pid": os.getpid(), "cpu_s": round(cpu() - cpu0, 3), "wall_s": round(time.perf_counter() - t0, 3),
                  "steps": s.steps, "sim_s": s.sim_s, "prefix_hit_ratio": s.prefix_hit_ratio,
                  "summary": {k: v for k, v in s.to_dict().items() if k not in MEASURED}}))
"""


def export(ref: str, dest: Path) -> str:
    """Write the tree of ``ref`` into ``dest``; returns its full commit id."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode:
        raise SystemExit(f"--base {ref}: not a commit of {ROOT} ({sha.stderr.strip()})")
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha.stdout.strip()], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"git archive {ref} failed")
    return sha.stdout.strip()


def rows(trace: Path) -> dict:
    """{family: table in seq order without the measured columns} of a trace directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    for fam in sorted(p for p in trace.iterdir() if p.is_dir()):
        files = sorted(fam.rglob("*.parquet"))
        if files:
            t = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("seq")
            out[fam.name] = t.select([c for c in t.column_names if c not in MEASURED])
    return out


def first_difference(a: Path, b: Path) -> str | None:
    """None when the runs at ``a`` and ``b`` wrote the same rows, else where they first part."""
    ra, rb = rows(a), rows(b)
    if sorted(ra) != sorted(rb):
        return f"families {sorted(ra)} vs {sorted(rb)}"
    for fam in ra:
        x, y = ra[fam], rb[fam]
        if x.column_names != y.column_names:
            return f"{fam}: columns {x.column_names} vs {y.column_names}"
        if x.num_rows != y.num_rows:
            return f"{fam}: {x.num_rows} rows vs {y.num_rows}"
        for c in x.column_names:
            if not x.column(c).equals(y.column(c)):
                xs, ys = x.column(c).to_pylist(), y.column(c).to_pylist()
                i = next(i for i, (p, q) in enumerate(zip(xs, ys)) if p != q)
                return f"{fam}.{c} row {i}: {xs[i]!r} vs {ys[i]!r}"
    return None


def summary_difference(a: dict, b: dict) -> str | None:
    """None when two runs' summaries agree on every figure but the measured ones and the run's
    own path, else the first figure where they part (a figures-only run writes no rows)."""
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            return f"summary.{k}: {a.get(k)!r} vs {b.get(k)!r}"
    return None


def _instructions(out_prefix: Path, pid: int) -> int:
    """The instructions callgrind counted in process ``pid`` (its ``totals:`` line)."""
    path = Path(f"{out_prefix}.{pid}")
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"{path}: callgrind wrote no totals line")


def measure(base: str, *, workload: str, policy: str, sets: list[str], requests: int, rounds: int,
            detail: str = "counts", instructions: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="kvtrace-ab-") as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        sha = export(base, tmp / "base")
        trees = {"base": tmp / "base", "head": ROOT}
        cpu: dict[str, list[float]] = {"base": [], "head": []}
        wall: dict[str, list[float]] = {"base": [], "head": []}
        counted: dict[str, list[int]] = {"base": [], "head": []}
        same, result = None, {}
        for r in range(rounds):
            procs = {}
            for name, root in trees.items():
                out = tmp / f"{name}-{r}"
                cmd = [sys.executable, "-c", _CHILD, str(root), str(out), workload, policy, str(requests), detail, *sets]
                env = None
                if instructions:
                    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                           f"--callgrind-out-file={tmp}/cg-{name}-{r}.%p", *cmd]
                    env = {**os.environ, "KVTRACE_AB_CALLGRIND": "1"}
                procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for name, p in procs.items():
                stdout, stderr = p.communicate()
                if p.returncode:
                    raise SystemExit(f"the {name} tree's replay failed (exit {p.returncode}):\n{stderr.strip()[-2000:]}")
                result[name] = json.loads(stdout.strip().splitlines()[-1])
                cpu[name].append(result[name]["cpu_s"])
                wall[name].append(result[name]["wall_s"])
                if instructions:
                    counted[name].append(_instructions(tmp / f"cg-{name}-{r}", result[name]["pid"]))
            if r == 0:
                same = (summary_difference(result["base"]["summary"], result["head"]["summary"])
                        if detail == "figures" else first_difference(tmp / "base-0", tmp / "head-0"))
        ratios = [b / h for b, h in zip(cpu["base"], cpu["head"]) if h > 0]
        extra = {}
        if instructions:
            extra = {"base_instructions": counted["base"], "head_instructions": counted["head"],
                     "instructions_ratio": round(statistics.median(
                         b / h for b, h in zip(counted["base"], counted["head"])), 4)}
        return {**extra, "base": base, "base_sha": sha, "workload": workload, "policy": policy, "sets": sets, "detail": detail,
                "requests": requests or None, "rounds": rounds, "steps": result["head"]["steps"],
                "sim_s": result["head"]["sim_s"], "base_cpu_s": cpu["base"], "head_cpu_s": cpu["head"],
                "base_wall_s": wall["base"], "head_wall_s": wall["head"],
                "cpu_ratio": round(statistics.median(ratios), 3) if ratios else None,
                "identical": same is None, "first_difference": same,
                "same_summary": result["base"]["prefix_hit_ratio"] == result["head"]["prefix_hit_ratio"]
                and result["base"]["steps"] == result["head"]["steps"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git ref to compare this tree with")
    ap.add_argument("--workload", default="data/workloads/mixed")
    ap.add_argument("--policy", default="swa-fixes")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    ap.add_argument("--requests", type=int, default=0, help="replay the first N arrivals only (0: all)")
    ap.add_argument("--rounds", type=int, default=1, help="side-by-side rounds (the ratio is their median)")
    ap.add_argument("--detail", default="counts", choices=("counts", "figures"),
                    help="figures: figures-only runs (a plan's splits), compared by their summaries")
    ap.add_argument("--instructions", action="store_true",
                    help="count each side's instructions under valgrind's callgrind (deterministic; ~50x slower: "
                         "use --requests)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 0:
        raise SystemExit("--rounds must be >= 1 and --requests >= 0")
    if not (Path(args.workload) / "manifest.json").is_file():  # before exporting a tree for it
        raise SystemExit(f"replay_ab: {args.workload}: not a workload or trace directory (no manifest.json)")
    if args.instructions:
        missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
        if missing:
            raise SystemExit(f"--instructions needs {' and '.join(missing)} on PATH (e.g. apt install valgrind)")
    t0 = time.perf_counter()
    out = measure(args.base, workload=args.workload, policy=args.policy, sets=args.sets, requests=args.requests,
                  rounds=args.rounds, detail=args.detail, instructions=args.instructions)
    out["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'tree':6} {'CPU s (per round)':>28} {'wall s':>20}")
        for name in ("base", "head"):
            print(f"{name:6} {', '.join(f'{x:.1f}' for x in out[name + '_cpu_s']):>28} "
                  f"{', '.join(f'{x:.1f}' for x in out[name + '_wall_s']):>20}")
        if args.instructions:
            print(f"instructions: base {', '.join(f'{x:,}' for x in out['base_instructions'])}   head "
                  f"{', '.join(f'{x:,}' for x in out['head_instructions'])}   ratio {out['instructions_ratio']}")
        print(f"cpu_ratio (base/head, median): {out['cpu_ratio']}   steps {out['steps']}   "
              f"identical rows: {out['identical']}" + (f" ({out['first_difference']})" if not out["identical"] else ""))
    return out


if __name__ == "__main__":
    from replay.errors import KvtraceError

    try:
        main()
    except KeyboardInterrupt:  # the children got the same SIGINT; the temporary trees are removed
        sys.stderr.write("replay_ab: interrupted by SIGINT (no figures)\n")
        raise SystemExit(130) from None
    except KvtraceError as e:  # a workload, policy or knob refused: one line
        sys.exit(f"replay_ab: {e}")
