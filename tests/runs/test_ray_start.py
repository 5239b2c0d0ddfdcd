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


def test_init_sees_the_boot_directory_first_and_the_environment_is_put_back(no_wait, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    seen = []

    class Seeing(FakeRay):
        def init(self, **kw):
            seen.append(os.environ["PYTHONPATH"])
            super().init(**kw)

    ray = Seeing(failures=1)
    assert ray_start.start_ray(ray, 2) is True
    assert seen == [f"{ray_start.BOOT_DIR}{os.pathsep}/somewhere"] * 2
    assert ray.inits[-1]["runtime_env"]["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == ray_start.BOOT_DIR
    assert os.environ["PYTHONPATH"] == "/somewhere"
    monkeypatch.delenv("PYTHONPATH")
    ray_start.start_ray(Seeing(failures=0), 2)
    assert "PYTHONPATH" not in os.environ


def _python(code: str, pythonpath: str) -> str:
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def test_boot_directory_makes_jsonschema_skip_rfc3987_syntax_and_runs_a_hidden_sitecustomize(tmp_path):
    pytest.importorskip("jsonschema")
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.HIDDEN_RAN = True\n")
    out = _python("import sys, builtins, jsonschema\n"
                  "print(sys.modules['rfc3987_syntax'], getattr(builtins, 'HIDDEN_RAN', False),"
                  " 'iri' in jsonschema.FormatChecker.checkers)",
                  os.pathsep.join([ray_start.BOOT_DIR, str(tmp_path)]))
    assert out == "None True False"
    # without the boot directory the environment is as installed (the module is imported when present)
    plain = _python("import sys, jsonschema; print('rfc3987_syntax' in sys.modules and sys.modules['rfc3987_syntax'] is not None)",
                    str(tmp_path))
    try:
        import importlib.util
        installed = importlib.util.find_spec("rfc3987_syntax") is not None
    except ImportError:
        installed = False
    assert plain == str(installed)


def test_the_error_quotes_the_raylets_own_reason(no_wait, monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv(ray_start.ATTEMPTS_ENV, "1")
    logs = tmp_path / "ray" / f"session_2026-12-05_12-53-19_238521_{os.getpid()}" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text(
        "[2026-12-05 12:53:45,674 I 1865 1865] (raylet) main.cc:283: Setting cluster ID to: 67\n"
        "[2026-12-05 12:54:01,076 C 1865 1865] (raylet) node_manager.cc:3576:  An unexpected system state"
        " has occurred. Check failed: statussetor3576.has_value() Timed out waiting for file"
        " /tmp/ray/session_x/metrics_agent_port_927b\n")
    other = tmp_path / "ray" / "session_2026-12-05_12-53-19_238521_42" / "logs"  # another process's
    other.mkdir(parents=True)
    (other / "raylet.out").write_text("[2026-12-05 12:54:01,076 C 1 1] (raylet) Check failed: x.has_value() other\n")
    with pytest.raises(RunError) as e:
        ray_start.start_ray(FakeRay(failures=5), 2)
    msg = str(e.value)
    assert "The raylet's log says: Timed out waiting for file /tmp/ray/session_x/metrics_agent_port_927b" in msg
    assert "ray-project/ray#65983" in msg and "other" not in msg
    assert ray_start.raylet_cause(str(tmp_path / "absent")) == ""


def test_ctrl_c_mid_start_ends_what_the_start_left_and_goes_on(no_wait):
    class Interrupted(FakeRay):
        def init(self, **kw):
            self.inits.append(kw)
            raise KeyboardInterrupt

    ray = Interrupted(failures=0)
    with pytest.raises(KeyboardInterrupt):
        ray_start.start_ray(ray, 2)
    assert len(ray.inits) == 1 and ray.shutdowns == 1 and no_wait == [[101]]  # no retry; agents ended
