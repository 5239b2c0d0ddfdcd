"""Every benchmark that reads a workload or trace refuses a path that is none in one line on
stderr (the script's name, the path, what was expected), with no traceback and nothing on
stdout, before it measures anything (``replay_ab`` before exporting a tree)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = {  # script: (arguments naming the missing path, exit status)
    "replay_speed.py": (["--workload", "{p}", "--backends", "reference", "--coalescing", "figures"], 1),
    "replay_ab.py": (["--base", "HEAD", "--workload", "{p}"], 1),
    "plan_speed.py": (["--workload", "{p}"], 2),
    "scheduler_speed.py": (["--workload", "{p}"], 1),
    "verify_speed.py": (["--trace", "{p}"], 1),
    "replay_throughput.py": (["--workload", "{p}"], 1),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_a_missing_workload_or_trace_is_refused_in_one_line(script, tmp_path):
    missing = tmp_path / "nope"
    args, code = CASES[script]
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *[a.format(p=missing) for a in args],
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == code, (script, out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert str(missing) in out.stderr and out.stdout == "", (out.stdout, out.stderr)
