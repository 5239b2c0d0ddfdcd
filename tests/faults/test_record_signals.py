"""SIGINT, SIGTERM and SIGKILL at a random point of a real ``kvtrace record`` (small workload):
SIGINT/SIGTERM stop the recorder cleanly (exit 130/143, rank interrupted, every issued event on
disk); SIGKILL leaves a crashed rank that recover restores with every loss counted. A record
that ends normally is complete and passes ``inspect --strict``."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from tests.faults.util import KVTRACE, accounting, assert_clean_failure, run

pytestmark = [pytest.mark.slow, pytest.mark.sglang]


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    w = tmp_path_factory.mktemp("w") / "w"
    res = run("workload", "generate", "--shape", "multi_turn", "--requests", "40", "--out", w)
    assert res.returncode == 0, res.stderr
    return w


def _record_until_recording(workload, out, delay_s):
    p = subprocess.Popen([KVTRACE, "record", "--workload", str(workload), "--out", str(out), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank = out / "ranks" / "rank=0.json"
    deadline = time.monotonic() + 240
    while not rank.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    return p


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_signal_at_a_random_point_of_record(tmp_path, workload, sig):
    out = tmp_path / "t"
    p = _record_until_recording(workload, out, random.Random(int(sig)).random() * 1.5)
    if p.poll() is not None:
        pytest.fail(f"record ended before the signal: {p.stderr.read()[-2000:]}")
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    res = subprocess.CompletedProcess(p.args, p.returncode, "", err)
    if sig == signal.SIGKILL:
        assert p.returncode == -signal.SIGKILL
        assert_clean_failure(run("inspect", "--strict", out), "crashed", code=1)
        r = run("recover", out)
        assert "Traceback" not in r.stderr and r.returncode in (0, 1)
        acc = accounting(out)
        assert acc["info"]["state"] == "recovered"
        assert acc["written"] + acc["dropped"] == max(acc["max_seq"], acc["info"]["issued"])
        return
    assert_clean_failure(res, str(out), f"interrupted by {signal.Signals(sig).name}",
                         "rank file says interrupted", code=128 + int(sig))
    acc = accounting(out)
    assert acc["info"]["state"] == "interrupted" and not list(out.rglob("*.arrows"))
    assert acc["written"] == acc["info"]["issued"] == acc["max_seq"] and acc["dropped"] == 0
    s = run("inspect", "--strict", "--json", out)
    assert s.returncode == 1 and json.loads(s.stdout)["state"] == "interrupted"
    assert any("was interrupted" in q for q in json.loads(s.stdout)["problems"])


def test_record_to_the_end_is_complete_and_strict_clean(tmp_path, workload):
    out = tmp_path / "t"
    res = run("record", "--workload", workload, "--out", out, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["end_state"] == "complete"
    s = run("inspect", "--strict", "--json", out)
    assert s.returncode == 0, s.stdout + s.stderr
    assert json.loads(s.stdout)["state"] == "complete"
