"""SIGTERM/SIGINT in the middle of ``kvtrace replay`` and ``kvtrace sweep`` (real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs.conftest import SMALL

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def _kvtrace(*args: str) -> subprocess.Popen:
    code = "import sys; from replay.cli import main; sys.argv[0] = 'kvtrace'; main()"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def _wait_for(pred, proc, timeout_s: float = 240.0) -> None:
    t0 = time.monotonic()
    while not pred():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout_s, "timed out waiting"
        time.sleep(0.05)


def _sets() -> list[str]:
    return [x for kv in SMALL for x in ("--set", kv)]


@pytest.fixture(scope="module")
def long_workload(tmp_path_factory):
    """Thousands of decode steps: a run that lasts well past the recorder's first flush."""
    from replay.backends.sglang import write_workload
    from tests.runs.conftest import multi_turn_rows

    return write_workload(tmp_path_factory.mktemp("wl") / "long", multi_turn_rows(output_tokens=1500),
                          hash_block_tokens=16)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_replay_stopped_mid_run_is_kept_and_marked(long_workload, tmp_path, sig):
    out = tmp_path / "run"
    proc = _kvtrace("replay", str(long_workload), "--policy", "swa-fixes", "--out", str(out), "--quiet",
                    *_sets())
    # stop it once the recorder has flushed some of the run
    _wait_for(lambda: any(out.glob("stats/rank=0/*")), proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in err and "Traceback" not in err
    rank = json.loads(next((out / "ranks").glob("rank=*.json")).read_text())
    assert rank.get("end_state", rank.get("state")) == "interrupted", rank
    assert not (out / "summary.json").exists()  # not a complete run: compare and sweep skip it


def test_sweep_stopped_keeps_complete_runs_and_resumes(small_workload, tmp_path):
    out = tmp_path / "R"
    args = ("sweep", str(small_workload), "--policies", "baseline,swa-fixes", "--grid",
            "max_running_requests=2,4", "--jobs", "1", "--out", str(out), "--quiet", *_sets())
    proc = _kvtrace(*args)
    _wait_for(lambda: any(out.glob("policy=*/*/summary.json")), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    import polars as pl

    table = pl.read_parquet(out / "summary.parquet")
    done = table.filter(pl.col("status") == "ok")["run"].to_list()
    assert 1 <= len(done) < 4 and set(table["status"]) <= {"ok", "interrupted"}
    mtimes = {r: (out / r / "summary.json").stat().st_mtime_ns for r in done}
    proc = _kvtrace(*args)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    table = pl.read_parquet(out / "summary.parquet")
    assert table.height == 4 and set(table["status"]) == {"ok"}
    assert {r: (out / r / "summary.json").stat().st_mtime_ns for r in done} == mtimes
