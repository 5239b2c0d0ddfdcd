"""``bench/replay_ab.py``: a tree against a git ref, side by side; the same code writes the same
rows (``identical``), and a ref that is not a commit is refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "replay_ab.py"


def _git_ok() -> bool:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "HEAD"], capture_output=True)
    return r.returncode == 0


def _clean() -> bool:
    r = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "replay", "tracer"],
                       capture_output=True, text=True)
    return r.returncode == 0 and not r.stdout.strip()


@pytest.mark.skipif(not _git_ok(), reason="not a git checkout: the bench exports a commit with git archive")
@pytest.mark.skipif(_git_ok() and not _clean(), reason="replay/ or tracer/ differ from HEAD: HEAD is not this tree")
def test_the_same_commit_writes_the_same_rows():
    out = subprocess.run([sys.executable, str(BENCH), "--base", "HEAD", "--workload", "data/workloads/multi_turn",
                          "--requests", "25", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["identical"] is True and d["first_difference"] is None and d["same_summary"] is True
    assert d["steps"] > 0 and len(d["base_cpu_s"]) == len(d["head_cpu_s"]) == 1 and d["cpu_ratio"] > 0


@pytest.mark.skipif(not _git_ok(), reason="not a git checkout: the bench exports a commit with git archive")
@pytest.mark.skipif(_git_ok() and not _clean(), reason="replay/ or tracer/ differ from HEAD: HEAD is not this tree")
def test_figures_only_runs_compare_by_their_summaries():
    out = subprocess.run([sys.executable, str(BENCH), "--base", "HEAD", "--workload", "data/workloads/multi_turn",
                          "--requests", "25", "--detail", "figures", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["detail"] == "figures" and d["identical"] is True and d["first_difference"] is None
    assert d["steps"] > 0


def test_a_ref_that_is_no_commit_is_refused():
    out = subprocess.run([sys.executable, str(BENCH), "--base", "no-such-ref-kvtrace"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--base no-such-ref-kvtrace: not a commit" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(not _git_ok(), reason="not a git checkout: the bench exports a commit with git archive")
@pytest.mark.skipif(_git_ok() and not _clean(), reason="replay/ or tracer/ differ from HEAD: HEAD is not this tree")
@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="--instructions needs valgrind and callgrind_control on PATH")
def test_the_same_commit_counts_the_same_instructions():
    """Under callgrind the same code on both sides counts the same instructions (the warm-up keeps
    the lazy imports out of the count): within 0.5 %."""
    out = subprocess.run([sys.executable, str(BENCH), "--base", "HEAD", "--workload", "data/workloads/multi_turn",
                          "--requests", "10", "--detail", "figures", "--instructions", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["identical"] is True and len(d["base_instructions"]) == len(d["head_instructions"]) == 1
    assert d["head_instructions"][0] > 10_000_000
    assert abs(d["instructions_ratio"] - 1) < 0.005, d["instructions_ratio"]


def test_instructions_without_valgrind_are_refused_in_one_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no valgrind here
    out = subprocess.run([sys.executable, str(BENCH), "--base", "HEAD", "--instructions"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--instructions needs valgrind and callgrind_control on PATH" in out.stderr
    assert "Traceback" not in out.stderr
