"""What the Ray boot directory saves a ``--executor ray`` sweep (replay/runs/ray_start.py).

    python bench/ray_sweep.py            # table
    python bench/ray_sweep.py --json     # one JSON object

Each round runs the same 4-run reference sweep (tests/runs/conftest.py's small multi-turn
workload, ``--jobs 2``, a fresh local Ray each time) twice, alternating: as kvtrace runs it
(``replay/runs/ray_boot`` first on Ray's processes' ``PYTHONPATH``: jsonschema skips
``rfc3987_syntax``) and without it (an empty directory in its place). Each sweep runs in its own
Python process. ``--json`` keys: ``rounds``, ``with_wall_s`` and ``without_wall_s`` (each
sweep's wall seconds, Ray's start included), ``median_with_s``, ``median_without_s``, ``ratio``
(median without / median with), ``load_avg`` (at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ONE = """
import sys, tempfile, time
sys.path.insert(0, {root!r})
from replay.runs import ray_start
if {without!r}:
    ray_start.BOOT_DIR = tempfile.mkdtemp()
from tests.runs.conftest import SMALL, multi_turn_rows
from replay.backends.sglang import write_workload
from replay.runs.sweep import sweep
d = tempfile.mkdtemp()
w = write_workload(d + "/w", multi_turn_rows(), hash_block_tokens=16)
t = time.perf_counter()
df = sweep(w, d + "/out", policies=["baseline", "swa-fixes"], grid=["max_running_requests=2,4"], sets=SMALL,
           jobs=2, executor="ray", backend="reference")
assert df.height == 4 and set(df["status"]) == {{"ok"}}, df
print("WALL", time.perf_counter() - t)
"""


_TERMINATED: list = []


def one(without: bool) -> float:
    """One sweep in its own process. Ctrl-C reaches it with this one (same process group) and
    SIGTERM is passed on, so the sweep ends its Ray itself; it is killed only after 60 s."""
    p = subprocess.Popen([sys.executable, "-c", _ONE.format(root=str(ROOT), without=without)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    def on_term(*_):
        _TERMINATED.append(True)
        p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    try:
        out, err = p.communicate(timeout=900)
    except BaseException:
        try:
            p.wait(60)
        except BaseException:
            p.kill()
        raise
    if _TERMINATED:
        raise SystemExit("ray_sweep: terminated (SIGTERM passed to the running sweep, which ended its Ray); "
                         "nothing printed")
    if p.returncode != 0:
        raise SystemExit(f"ray_sweep: a sweep failed ({'without' if without else 'with'} the boot directory):\n"
                         + err[-3000:])
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("WALL")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="with/without pairs (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    load = os.getloadavg()[0]
    with_s, without_s = [], []
    try:
        for _ in range(a.rounds):
            with_s.append(one(False))
            without_s.append(one(True))
    except KeyboardInterrupt:
        print(f"ray_sweep: interrupted after {len(with_s) + len(without_s)} sweeps; nothing printed", file=sys.stderr)
        return 130
    res = {"rounds": a.rounds, "with_wall_s": [round(x, 2) for x in with_s],
           "without_wall_s": [round(x, 2) for x in without_s],
           "median_with_s": round(statistics.median(with_s), 2), "median_without_s": round(statistics.median(without_s), 2),
           "load_avg": round(load, 2)}
    res["ratio"] = round(res["median_without_s"] / res["median_with_s"], 2)
    if a.json:
        print(json.dumps(res))
    else:
        print(f"{'round':>5} {'with boot s':>12} {'without s':>10}")
        for i, (x, y) in enumerate(zip(with_s, without_s)):
            print(f"{i + 1:>5} {x:>12.1f} {y:>10.1f}")
        print(f"median {res['median_with_s']:.1f} s with, {res['median_without_s']:.1f} s without: {res['ratio']}x "
              f"(load average {load:.1f} at the start)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
