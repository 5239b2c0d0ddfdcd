"""``bench/plan_speed.py``: a plan of a small workload gives its figures as one JSON object (the
agreement table's split for mixed at 3 GB); a missing workload, a bad preset or budget are refused
in one line, SIGINT ends it with 130 and no figures, and a full disk is one line that offers no resume
(the bench's plan directory is temporary)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "plan_speed.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_a_plan_of_mixed_gives_its_figures():
    out = _bench("--workload", "data/workloads/mixed", "--kv-gb", "3", "--jobs", "1", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    assert d["splits"] == 12 and 1 <= d["splits_run"] <= 12 and d["jobs"] == 1
    assert d["best_ratio"] == 0.1  # docs/capacity.md "Agreement": mixed at 3 GB
    best = next(r for r in d["rows"] if r["swa_full_tokens_ratio"] == 0.1)
    assert best["prefix_hit_ratio"] == 0.118559 and best["feasible"]
    assert d["wall_s"] > 0 and d["cpu_s"] > 0 and d["realtime_x"] > 0


def test_bad_inputs_are_refused_in_one_line(tmp_path):
    missing = tmp_path / "production_1h"
    missing.mkdir()
    for args, code, text in (
        (["--workload", str(missing)], 2, "no manifest.json) (git-ignored: `make data` writes it)"),
        (["--workload", str(tmp_path / "nope")], 2, "not a workload or trace directory"),
        (["--workload", "data/workloads/mixed", "--model", "nosuch"], 1, "unknown model preset"),
        (["--workload", "data/workloads/mixed", "--kv-gb", "-3"], 1, "expected a positive number of GB"),
    ):
        out = _bench(*args, "--json")
        assert out.returncode == code, (args, out.stderr)
        assert out.stderr.startswith("plan_speed.py: ") and text in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert out.stdout == ""


def test_sigint_ends_it_with_no_figures(tmp_path):
    # placed by progress: SIGINT once the sweep's first split is handed out (its ``.job.json``
    # in the plan's temporary directory, under ``TMPDIR``), with 11 more to run
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(BENCH), "--workload", "data/workloads/mixed", "--kv-gb", "3",
                             "--jobs", "1", "--early-stop", "off", "--run-infeasible", "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not any(tmp_path.glob("kvtrace-bench-plan-*/p/.partial/*.job.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the plan never handed out a split"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    if proc.returncode == 0:  # every split finished first (a very fast machine): nothing to interrupt
        assert json.loads(out.strip().splitlines()[-1])["splits_run"] == 12
        return
    assert proc.returncode == 130, err
    assert err.strip() == "plan_speed.py: interrupted by SIGINT (no figures)" and out == ""
    assert not list(tmp_path.glob("kvtrace-bench-plan-*")), "the plan's temporary directory was left behind"


def test_a_full_disk_is_one_line_and_offers_no_resume(tmp_path):
    import resource

    def small_files():  # 1 KB files at most: the sweep's table cannot be written (EFBIG, as ENOSPC)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    out = subprocess.run([sys.executable, str(BENCH), "--workload", "data/workloads/mixed", "--kv-gb", "3",
                          "--jobs", "1", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TMPDIR": str(tmp_path)}, preexec_fn=small_files)
    assert out.returncode == 1 and out.stdout == ""
    line, = out.stderr.strip().splitlines()
    assert line.startswith("plan_speed.py: ") and "could not write the sweep's table" in line
    assert "resume" not in line and "temporary and is removed" in line and str(tmp_path) in line
    assert list(tmp_path.iterdir()) == []  # the plan directory is gone
