"""Starting Ray for ``kvtrace sweep --executor ray``: a cluster from ``RAY_ADDRESS``, else a local one.

A local Ray start on a small, loaded machine can fail: the raylet waits a fixed ~15 s for its
dashboard agent (a Python process that imports Ray, about 3 s of CPU) to write its port file,
and the driver waits a fixed 30 s for the raylet to register, neither settable from ``ray.init``.
At a load average of 15-30 on 2 cores the agent takes 20-50 s and the start fails with "The
current node timed out during startup". So a local start is tried up to ``KVTRACE_RAY_START_ATTEMPTS``
times (default 3), each failed attempt's processes ended (by pid: those whose command line names
a session directory of this process, ``session_..._<pid>``; a crashed raylet leaves its agents
behind), with a pause between attempts; after the last one a :class:`RunError` says what to do.
"""

from __future__ import annotations

import os
import re
import sys
import time

from replay.runs.replay import RunError

ATTEMPTS_ENV = "KVTRACE_RAY_START_ATTEMPTS"
DEFAULT_ATTEMPTS = 3
PAUSE_S = 10.0


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
    kwargs.update(num_cpus=jobs, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    attempts = _attempts()
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return True
        except Exception as e:  # Ray raises a bare Exception for the start-up timeout
            _stop_failed_start(ray)
            if attempt == attempts:
                raise RunError(_failure(e, attempts)) from None
            time.sleep(PAUSE_S * attempt)
    return False  # (not reached)


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
    return (f"a local Ray did not start ({attempts} attempts; {load}): {type(e).__name__}: {e} "
            f"Ray's processes start too slowly on a loaded machine. Retry when it is less busy "
            f"(or set {ATTEMPTS_ENV}), start a cluster yourself (`ray start --head`) and set RAY_ADDRESS, "
            f"or use --executor local.")


def _stop_failed_start(ray) -> None:
    """End what a failed ``ray.init`` left running: ``ray.shutdown()`` for what Ray knows of,
    then, by pid, every process whose command line names a session of this process."""
    try:
        ray.shutdown()
    except Exception:
        pass
    mine = re.compile(rf"session_[0-9_-]+_{os.getpid()}(?![0-9])")
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
