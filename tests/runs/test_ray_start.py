"""``start_ray`` retries a local Ray start that times out on a loaded machine, ends each failed
attempt's processes by pid, and ends with a clear error (no Ray needed: a stand-in module)."""

from __future__ import annotations

import os

import pytest

from replay.runs import ray_start
from replay.runs.replay import RunError


class FakeRay:
    def __init__(self, failures: int):
        self.failures, self.inits, self.shutdowns, self.up = failures, [], 0, False

    def is_initialized(self):
        return self.up

    def init(self, **kw):
        self.inits.append(kw)
        if len(self.inits) <= self.failures:
            raise Exception("The current node timed out during startup.")
        self.up = True

    def shutdown(self):
        self.shutdowns += 1
        self.up = False


@pytest.fixture
def no_wait(monkeypatch):
    ended = []
    me = os.getpid()
    procs = [(101, f"raylet --session_dir=/tmp/ray/session_2026-12-01_04-01-03_611005_{me}"),
             (102, f"python agent.py --session-name=session_2026-12-01_04-01-03_611005_{me}1"),  # another pid
             (103, "python agent.py --session-name=session_2026-12-01_04-01-03_611005_42")]
    monkeypatch.setattr(ray_start, "PAUSE_S", 0.0)
    monkeypatch.setattr(ray_start, "_processes", lambda: iter(procs))
    monkeypatch.setattr(ray_start, "_end", lambda pids: ended.append(pids))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(ray_start.ATTEMPTS_ENV, raising=False)
    return ended


def test_retries_then_starts(no_wait):
    ray = FakeRay(failures=2)
    assert ray_start.start_ray(ray, 2) is True
    assert len(ray.inits) == 3 and ray.inits[-1]["num_cpus"] == 2 and ray.inits[-1]["include_dashboard"] is False
    assert no_wait == [[101], [101]]  # only this process's session, once per failed attempt
    assert ray_start.start_ray(ray, 2) is False  # already up: not ours to shut down


def test_clear_error_after_the_last_attempt(no_wait, monkeypatch):
    monkeypatch.setenv(ray_start.ATTEMPTS_ENV, "2")
    ray = FakeRay(failures=5)
    with pytest.raises(RunError) as e:
        ray_start.start_ray(ray, 2)
    msg = str(e.value)
    assert len(ray.inits) == 2 and "did not start (2 attempts" in msg and "timed out during startup" in msg
    assert "RAY_ADDRESS" in msg and "--executor local" in msg


def test_cluster_address_not_retried(no_wait, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray = FakeRay(failures=0)
    assert ray_start.start_ray(ray, 2) is True
    assert ray.inits == [{"address": "10.0.0.1:6379", "include_dashboard": False, "log_to_driver": False,
                          "ignore_reinit_error": True}]


@pytest.mark.parametrize("raw", ["0", "x"])
def test_bad_attempts_setting(no_wait, monkeypatch, raw):
    monkeypatch.setenv(ray_start.ATTEMPTS_ENV, raw)
    with pytest.raises(RunError, match="whole number of attempts"):
        ray_start.start_ray(FakeRay(0), 2)
