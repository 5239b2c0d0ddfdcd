"""``bench/replay_speed.py``: a short run (under ``SHORT_RUN_S`` wall, as mixed's ~0.2 s) is run
``--repeat`` times and its median run reported, every run's wall listed; a bad ``--repeat`` or
workload is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "replay_speed.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), "--workload", "data/workloads/mixed", "--backends", "reference",
                           "--coalescing", "figures", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_short_run_reports_its_median_of_the_repeats():
    out = _bench("--repeat", "3", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    walls = d["reference_figures_wall_s_runs"]
    assert len(walls) == 3 and d["reference_figures_wall_s"] == sorted(walls)[1]
    assert d["realtime_x_figures"] == d["reference_figures_sim_s_per_wall_s"] > 0
    assert d["reference_figures_steps"] == 7797 and d["reference_figures_requests_finished"] == 250


def test_one_run_and_a_bad_repeat():
    out = _bench("--repeat", "1", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(json.loads(out.stdout.strip().splitlines()[-1])["reference_figures_wall_s_runs"]) == 1
    for n in ("0", "-3", "101"):
        bad = _bench("--repeat", n)
        assert bad.returncode == 2 and "--repeat must be between 1 and 100" in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr


def test_a_bad_workload_is_refused_in_one_line():
    out = subprocess.run([sys.executable, str(BENCH), "--workload", "README.md", "--backends", "reference",
                          "--coalescing", "figures"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("replay_speed.py: README.md: cannot read its manifest.json"), out.stderr
