"""Starting Ray for ``kvtrace sweep --executor ray``: a cluster from ``RAY_ADDRESS``, else a local one.

A local Ray start on a small, loaded machine can fail: the raylet gives its dashboard agent a
fixed 15 s to write its port files and aborts after it (ray-project/ray#65983; not settable in
Ray 2.60: ``RAY_raylet_start_wait_time_s`` and pre-selected agent ports were tried, the raylet
still waits for the files). The agent is a Python process that imports Ray: 4.7 s of CPU on this
project's 2-core machine, 3.7 s of it jsonschema's optional IRI checker ``rfc3987_syntax``
building its grammar at import, and it starts beside four other Ray processes doing the same.
Measured there: a quiet start takes 24 s, the agent's port 9 of the 15 s; beside four busy
processes the raylet aborted ("Timed out waiting for file .../metrics_agent_port_...") and
the driver reported only "The current node timed out during startup".

A local start puts ``replay/runs/ray_boot`` first on its processes' ``PYTHONPATH`` (its
``sitecustomize`` marks ``rfc3987_syntax`` absent: ``import ray`` then costs 1.0 s of CPU instead
of 4.7 s), for the processes ``ray.init`` starts and for the workers (``runtime_env``); kvtrace's
own process is left as it is. A start can still fail, so a local start is tried up to
``KVTRACE_RAY_START_ATTEMPTS`` times (default 3), each failed attempt's processes ended (by pid:
those whose command line names a session directory of this process, ``session_..._<pid>``; a
crashed raylet leaves its agents behind), with a pause between attempts; after the last one a
:class:`RunError` says what to do and quotes the raylet's own reason from its log, which Ray's
message leaves out.
"""

from __future__ import annotations

import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from replay.runs.replay import RunError

ATTEMPTS_ENV = "KVTRACE_RAY_START_ATTEMPTS"
DEFAULT_ATTEMPTS = 3
PAUSE_S = 10.0
BOOT_DIR = str(Path(__file__).resolve().parent / "ray_boot")


def start_ray(ray, jobs: int) -> bool:
    """Connect to ``RAY_ADDRESS`` or start a local Ray with ``jobs`` CPUs; True if this call
    started (and so must shut down) Ray, False if it was already initialized."""
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    kwargs = dict(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    if address:
        ray.init(**kwargs)
        return True
    kwargs.update(num_cpus=jobs, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([BOOT_DIR, *sys.path])}})
    attempts = _attempts()
    for attempt in range(1, attempts + 1):
        try:
            with _boot_first():
                ray.init(**kwargs)
            return True
        except Exception as e:  # Ray raises a bare Exception for the start-up timeout
            _stop_failed_start(ray)
            if attempt == attempts:
                raise RunError(_failure(e, attempts)) from None
            time.sleep(PAUSE_S * attempt)
        except BaseException:  # Ctrl-C mid-start: the raylet's agents would outlive it otherwise
            _stop_failed_start(ray)
            raise
    return False  # (not reached)


@contextmanager
def _boot_first():
    """``BOOT_DIR`` first on ``PYTHONPATH`` while ``ray.init`` starts Ray's processes (they take
    this process's environment); put back afterwards."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, old] if old else [BOOT_DIR])
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _attempts() -> int:
    raw = os.environ.get(ATTEMPTS_ENV, "")
    try:
        n = int(raw) if raw else DEFAULT_ATTEMPTS
    except ValueError:
        raise RunError(f"{ATTEMPTS_ENV}={raw!r}: expected a whole number of attempts (>= 1)") from None
    if n < 1:
        raise RunError(f"{ATTEMPTS_ENV}={raw!r}: expected a whole number of attempts (>= 1)")
    return n


def _failure(e: Exception, attempts: int) -> str:
    try:
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        load = f"{os.cpu_count()} CPUs"
    cause = raylet_cause()
    return (f"a local Ray did not start ({attempts} attempts; {load}): {type(e).__name__}: {e} "
            + (f"The raylet's log says: {cause} " if cause else "")
            + ("(Ray's raylet gives its dashboard agent a fixed 15 s to start: ray-project/ray#65983) "
               if "Timed out waiting for file" in cause else "")
            + f"Ray's processes start too slowly on a loaded machine. Retry when it is less busy "
            f"(or set {ATTEMPTS_ENV}), start a cluster yourself (`ray start --head`) and set RAY_ADDRESS, "
            f"or use --executor local.")


def _session_of(pid: int) -> re.Pattern:
    """A Ray session directory's name started by process ``pid``: ``session_<date>_<time>_<pid>``."""
    return re.compile(rf"session_[0-9_-]+_{pid}(?![0-9])")


def ray_temp_dir() -> str:
    """Where a local Ray keeps its sessions: ``$RAY_TMPDIR/ray``, on Linux ``$TMPDIR/ray``, else
    ``/tmp/ray`` (Ray 2.60's own rule)."""
    base = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    return os.path.join(base or "/tmp", "ray")


def raylet_cause(temp_dir: str | None = None, pid: int | None = None) -> str:
    """The fatal line of the raylet of this process's newest session (``session_..._<pid>`` under
    :func:`ray_temp_dir`), without its timestamp; "" where there is none to read."""
    root = temp_dir or ray_temp_dir()
    mine = _session_of(pid or os.getpid())
    try:
        sessions = sorted((e for e in os.scandir(root) if e.is_dir() and mine.fullmatch(e.name)),
                          key=lambda e: e.stat().st_mtime)
    except OSError:
        return ""
    for session in reversed(sessions):
        try:
            with open(os.path.join(session.path, "logs", "raylet.out"), errors="replace") as f:
                fatal = [line for line in f if "Check failed" in line or " C " in line[:40]]
        except OSError:
            continue
        if fatal:
            line = re.sub(r"^\[[^\]]*\]\s*", "", fatal[0].strip())  # its [time level pid tid]
            line = line.split("Check failed:", 1)[-1].strip()
            return re.sub(r"^\S+\.has_value\(\)\s*", "", line)[:400]
    return ""


def _stop_failed_start(ray) -> None:
    """End what a failed ``ray.init`` left running: ``ray.shutdown()`` for what Ray knows of,
    then, by pid, every process whose command line names a session of this process."""
    try:
        ray.shutdown()
    except Exception:
        pass
    mine = _session_of(os.getpid())
    pids = [pid for pid, cmd in _processes() if pid != os.getpid() and mine.search(cmd)]
    _end(pids)


def _processes():
    """(pid, command line) of the processes this one can see (Linux ``/proc``; none elsewhere)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(name), cmd


def _end(pids: list[int], grace_s: float = 5.0) -> None:
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except OSError:
                pass
        if not alive or sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in alive if _running(p)]
        pids = alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
