"""``kvtrace sweep`` with its warm zygote: Ctrl-C to the whole process group, a zygote that dies."""

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


def _sweep(source: Path, out: Path, jobs: int, policies: str = "baseline,swa-fixes",
           grid: str = "max_running_requests=2,4", *, sigint_ignored: bool = False,
           env: dict | None = None) -> subprocess.Popen:
    """``kvtrace sweep`` in its own session, as a terminal's foreground job would be (with
    ``sigint_ignored``, as a script's background job is: the shell leaves SIGINT ignored)."""
    code = "import sys; from replay.cli import main; sys.argv[0] = 'kvtrace'; main()"
    args = ["sweep", str(source), "--policies", policies, "--grid", grid,
            "--jobs", str(jobs), "--out", str(out), "--quiet", *[x for kv in SMALL for x in ("--set", kv)]]
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})), cwd=ROOT,
                            start_new_session=True,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None)


def _wait_for(pred, proc, timeout_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while not pred():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout_s, "timed out waiting"
        time.sleep(0.05)


def _group_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_to_the_process_group_keeps_complete_runs_and_leaves_no_process(small_workload, tmp_path):
    import polars as pl

    out = tmp_path / "R"
    proc = _sweep(small_workload, out, jobs=2)
    _wait_for(lambda: any(out.glob("policy=*/*/summary.json")), proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the sweep, its zygote, its runs
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert _group_gone(proc.pid), "the zygote or a run outlived the sweep"
    table = pl.read_parquet(out / "summary.parquet")
    assert table.height == 4 and set(table["status"]) <= {"ok", "interrupted"}
    assert 1 <= table.filter(pl.col("status") == "ok").height < 4


@pytest.mark.parametrize("zygote", ["1", "0"], ids=["zygote", "cold"])
def test_a_sweep_that_ignores_sigint_loses_no_run_to_it(small_workload, tmp_path, zygote):
    """A background job of a script ignores SIGINT (the shell's doing): a Ctrl-C meant for the
    foreground reaches its process group, and neither the sweep nor any of its runs stops; before,
    the zygote's children (and cold runs) took it, and the sweep went on with those runs failed."""
    import polars as pl

    out = tmp_path / "R"
    # two runs, both running when the signals come (four took ~160 s of CI cold)
    proc = _sweep(small_workload, out, jobs=2, policies="baseline", sigint_ignored=True,
                  env={"KVTRACE_SWEEP_ZYGOTE": zygote})
    _wait_for(lambda: any(out.glob(".partial/*.job.json")), proc)
    time.sleep(0.5)  # the runs have started: each child has set its signals
    for _ in range(3):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.2)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    table = pl.read_parquet(out / "summary.parquet")
    assert table.height == 2 and set(table["status"]) == {"ok"}, table


def test_a_dead_zygote_fails_its_running_runs_and_the_rest_go_on_cold(small_workload, tmp_path):
    # three runs (each cold one imports sglang: ~15 CPU s): the zygote's, then two cold ones, so
    # the sweep is seen to go on cold past the first run after the zygote died
    out = tmp_path / "R"
    proc = _sweep(small_workload, out, jobs=1, policies="baseline", grid="max_running_requests=2,3,4")
    info = out / ".partial" / "zygote.json"
    _wait_for(lambda: info.is_file() and any((out / ".partial").glob("*.log")), proc)
    os.kill(json.loads(info.read_text())["pid"], signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err  # a failed run: the sweep says so and exits 1
    assert "starting a cold process per run" in err and "Traceback" not in err
    import polars as pl

    table = pl.read_parquet(out / "summary.parquet")
    failed = table.filter(pl.col("status") == "failed")
    assert failed.height == 1 and "zygote exited" in failed["error"][0]
    assert table.height == 3 and table.filter(pl.col("status") == "ok").height == 2
    assert _group_gone(proc.pid)


def test_sigterm_during_the_zygotes_imports_ends_it_at_once():
    """A sweep stopped in its first seconds: its zygote, still importing sglang, exits on SIGTERM
    at once (before, it finished its imports first, seconds, and the sweep waited for it)."""
    proc = subprocess.Popen([sys.executable, "-m", "replay.runs.zygote", "sglang"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    time.sleep(1.0)  # its handler is set (before its imports start); sglang's imports take seconds
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 2.0, err.decode()[-2000:]
    assert proc.returncode == 128 + signal.SIGTERM and out == b"", (proc.returncode, out)
