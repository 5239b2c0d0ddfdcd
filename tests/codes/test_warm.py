"""Warm code processes (``replay.codes.warm``): a call in a fresh child of a warm parent gives
what a cold process gives, with the call's environment and directory, isolated from the calls
before it; failures and timeouts are reported and leave the parent serving."""

from __future__ import annotations

import subprocess

import pytest

from tests.fork.conftest import fork_tarball, require_fork

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("fork-driver")]
T = "tests.codes.warm_targets"


@pytest.fixture(scope="module")
def code():
    require_fork()
    from replay.codes import prepare

    return prepare(fork_tarball("post659"))


def test_warm_calls_are_cold_calls_without_the_import(code, monkeypatch, tmp_path):
    from replay.codes import CodeCallError, call_in_code, warm

    monkeypatch.setenv("KVTRACE_CODE_WARM", "1")
    monkeypatch.chdir(tmp_path)
    env = {"SGLANG_KVTRACE_PROBE": "7"}
    a = call_in_code(code, f"{T}:facts", {"name": "SGLANG_KVTRACE_PROBE"}, env=env).result
    b = call_in_code(code, f"{T}:facts", {"name": "SGLANG_KVTRACE_PROBE"}, env=env).result
    parent = warm.warm_for(subprocess_env(code, env))
    assert a["ppid"] == b["ppid"] == parent.ready["pid"] and a["pid"] != b["pid"]  # one parent, two children
    assert a["counter"] == b["counter"] == 1  # each call starts from the parent's state
    assert a["env"] == "7" and a["cwd"] == str(tmp_path) and "kvtrace-codes" in a["sglang"]
    with pytest.raises(CodeCallError, match="planted failure"):
        call_in_code(code, f"{T}:boom", env=env)
    with pytest.raises(subprocess.TimeoutExpired):
        call_in_code(code, f"{T}:nap", {"seconds": 60}, env=env, timeout_s=3)
    assert call_in_code(code, f"{T}:nap", {"seconds": 0}, env=env).result == "woke"  # still serving
    # another environment: another parent; at most KVTRACE_CODE_WARM_MAX of them (the oldest exits)
    monkeypatch.setenv("KVTRACE_CODE_WARM_MAX", "1")
    other = call_in_code(code, f"{T}:facts", {"name": "SGLANG_KVTRACE_PROBE"}, env={"SGLANG_KVTRACE_PROBE": "8"}).result
    assert other["env"] == "8" and other["ppid"] != a["ppid"]
    assert len(warm._WARM) == 1 and parent.proc.poll() is not None

    monkeypatch.setenv("KVTRACE_CODE_WARM", "0")  # the same call cold
    cold = call_in_code(code, f"{T}:facts", {"name": "SGLANG_KVTRACE_PROBE"}, env=env).result
    assert {k: cold[k] for k in ("env", "cwd", "sglang", "counter")} == {k: a[k] for k in ("env", "cwd", "sglang", "counter")}
    assert cold["ppid"] != a["ppid"]


def subprocess_env(code, env):
    from replay.codes.runner import code_environ

    return code_environ(code, env)
