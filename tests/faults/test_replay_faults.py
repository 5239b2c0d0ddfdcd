"""Signals and a full disk during a real ``kvtrace replay`` (reference backend, a 1,500-request
mixed workload that replays in a few seconds): SIGINT/SIGTERM stop it cleanly (exit 130/143, one
error line, rank interrupted, every issued event on disk); SIGKILL leaves a crashed trace that
``kvtrace recover`` restores with every loss counted; a full disk ends it with exit 1 and one
error line. In every case the run directory is kept: a second replay into it is refused unless
``--force``, which then replays to the end."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from tests.faults.util import (KVTRACE, accounting, assert_clean_failure, file_size_limit, no_temporaries,
                               run)

pytestmark = [pytest.mark.slow]

REQUESTS = 1500


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    w = tmp_path_factory.mktemp("w") / "w"
    res = run("workload", "generate", "--shape", "mixed", "--requests", REQUESTS, "--out", w)
    assert res.returncode == 0, res.stderr
    return w


def _replay(workload, out, *extra, **kw):
    return run("replay", workload, "--backend", "reference", "--out", out, "--json", *extra, **kw)


def _pool_rows_flushed(out) -> bool:
    return any(f.stat().st_size > 0 for f in (out / "pool").rglob("*.arrows")) if (out / "pool").is_dir() else False


def _replay_until_recording(workload, out, seed: int):
    """A replay running, with its first pool rows on disk (the signal then lands mid-run)."""
    p = subprocess.Popen([KVTRACE, "replay", str(workload), "--backend", "reference", "--out", str(out),
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _pool_rows_flushed(out) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    # the run's last pool rows come ~1 s after its first on this machine (a 1,500-request replay
    # takes ~2.5 s with start-up): a short random delay lands the signal mid-run
    time.sleep(0.25 * random.Random(seed).random())
    if p.poll() is not None:
        pytest.fail(f"the replay ended before the signal (rc {p.returncode}): {p.stderr.read()[-2000:]}")
    return p


def test_an_interrupt_while_summarizing_says_the_trace_is_complete(tmp_path, workload, monkeypatch):
    """A signal after the replay's last step (while its summary is written) says so: the trace is
    complete, the summary is not written (the CLI turns SIGTERM into this KeyboardInterrupt)."""
    from replay.errors import Interrupted
    from replay.runs import replay as runs_replay

    def interrupted(*a, **k):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(runs_replay, "_summarize", interrupted)
    out = tmp_path / "r"
    with pytest.raises(Interrupted) as err:
        runs_replay.replay_run(workload, out, backend="reference", policy="swa-fixes")
    assert err.value.exit_code == 143
    msg = str(err.value)
    assert str(out) in msg and "after the replay's last step" in msg and "the trace is complete" in msg
    strict = run("inspect", "--strict", "--json", out)
    assert strict.returncode == 0 and json.loads(strict.stdout)["state"] == "complete", strict.stdout


def _leftover_processes(out) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if str(out) in line and "ps -eo" not in line]


def _assert_force_replays_to_the_end(workload, out):
    again = _replay(workload, out)
    assert_clean_failure(again, "already exists", "--force", code=2)
    res = _replay(workload, out, "--force")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["finished"] == REQUESTS
    strict = run("inspect", "--strict", "--json", out)
    assert strict.returncode == 0 and json.loads(strict.stdout)["state"] == "complete", strict.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_mid_replay_keep_every_event(tmp_path, workload, sig):
    out = tmp_path / "r"
    p = _replay_until_recording(workload, out, int(sig))
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    res = subprocess.CompletedProcess(p.args, p.returncode, "", err)
    name = signal.Signals(sig).name
    assert_clean_failure(res, str(out), f"interrupted by {name} after", f"of {REQUESTS} requests",
                         "rank file says interrupted", code=128 + int(sig))
    assert err.count("kvtrace: error:") == 1, err
    acc = accounting(out)
    assert acc["info"]["state"] == "interrupted" and not list(out.rglob("*.arrows"))
    assert 0 < acc["rows"]["request"] < 2 * REQUESTS  # stopped part-way, arrivals on disk
    strict = run("inspect", "--strict", "--json", out)
    assert strict.returncode == 1 and json.loads(strict.stdout)["state"] == "interrupted"
    assert _leftover_processes(out) == []
    _assert_force_replays_to_the_end(workload, out)
    assert acc["written"] == acc["info"]["issued"] == acc["max_seq"] and acc["dropped"] == 0


def test_sigkill_mid_replay_is_recovered_with_every_loss_counted(tmp_path, workload):
    out = tmp_path / "r"
    p = _replay_until_recording(workload, out, 9)
    p.kill()
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    time.sleep(0.2)
    assert _leftover_processes(out) == []
    assert_clean_failure(run("inspect", "--strict", out), "crashed", code=1)
    r = run("recover", out)
    assert "Traceback" not in r.stderr and r.returncode in (0, 1), r.stderr
    acc = accounting(out)
    assert acc["info"]["state"] == "recovered"
    assert acc["written"] + acc["dropped"] == max(acc["max_seq"], acc["info"]["issued"])
    assert acc["rows"].get("pool", 0) > 0
    rep = run("report", out, "--out", tmp_path / "report.html", "--json")
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["incomplete"], rep.stdout  # the report says the trace is incomplete
    _assert_force_replays_to_the_end(workload, out)


def test_full_disk_mid_replay_exits_1_with_one_error(tmp_path, workload):
    out = tmp_path / "r"
    res = _replay(workload, out, preexec_fn=file_size_limit(400_000))
    assert_clean_failure(res, str(out), "the recording failed", "File too large", code=1)
    assert res.stderr.count("kvtrace: error:") == 1, res.stderr
    acc = accounting(out)
    assert acc["info"]["state"] == "crashed" and no_temporaries(out) == []
    r = run("recover", out)
    assert "Traceback" not in r.stderr, r.stderr
    acc = accounting(out)
    assert acc["written"] + acc["dropped"] == max(acc["max_seq"], acc["info"]["issued"])
    assert_clean_failure(run("inspect", "--strict", out), "recovered", code=1)
    _assert_force_replays_to_the_end(workload, out)
