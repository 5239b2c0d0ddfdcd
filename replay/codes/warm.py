"""Warm processes of a code: import its sglang once, fork a fresh child per call.

A code's process spends most of its start importing (sglang, torch, transformers: 20-45 s of
CPU on a 2-core machine). With ``KVTRACE_CODE_WARM=1``, :func:`replay.codes.call_in_code` hands
its calls to a warm parent of that code (started at the first call, kept for the life of the
calling process): ``python -m replay.codes.warm`` in the code's environment bootstraps it
(:func:`replay.codes.bootstrap.bootstrap`), imports the modules a fork run needs (imports only:
no hook is installed, no recording started) and then forks one child per call, which runs
exactly what ``python -m replay.codes.entry call`` runs and exits. Each call thus starts from
the same pristine imported state, as isolated as a cold process, without paying the import.

One warm parent per (code, environment): the ``SGLANG_*`` / ``KVTRACE_*`` variables a call
runs with are part of the key, since a code may read them at import; a child also gets the
call's whole environment and working directory before it runs. Calls to one parent are made one
at a time (a lock); parents of other keys run side by side. A process keeps at most
``KVTRACE_CODE_WARM_MAX`` (2) parents, about 0.6 GB each; the least recently used one exits.

Protocol (one JSON object a line): parent -> warm (stdin) ``{"call": TARGET, "kwargs": PATH,
"result": PATH, "out": PATH, "err": PATH, "env": {...}, "cwd": DIR}``; warm -> parent (stdout)
``{"ready": ...}`` once, then per call ``{"pid": N}`` and ``{"status": S}`` (as
``Popen.returncode``). The warm parent ignores SIGINT, exits at the end of its stdin (its caller
is gone) and each child dies with it (``PR_SET_PDEATHSIG``). Linux only (``os.fork``); elsewhere,
and when the warm parent cannot start, calls run cold.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from replay.procs import die_with_parent, ignore_sigint, sigint_env, wait_readable

#: modules a fork run imports; imported once by the warm parent (missing ones are skipped)
PRELOAD = ("sglang.srt.managers.scheduler", "sglang.srt.mem_cache.allocator",
           "sglang.srt.mem_cache.swa_memory_pool", "sglang.srt.mem_cache.memory_pool",
           "sglang.srt.mem_cache.memory_pool_host", "sglang.srt.mem_cache.unified_radix_cache",
           "sglang.srt.mem_cache.common", "replay.backends.fork.backend", "replay.backends.fork.driver",
           "replay.workloads", "tracer.sglang", "tracer.sglang.hooks.fork", "pyarrow.parquet")
ENV_FLAG = "KVTRACE_CODE_WARM"
#: warm parents one process keeps at most (``KVTRACE_CODE_WARM_MAX``; ~0.6 GB each): the least
#: recently used one exits when another is needed
DEFAULT_MAX = 2


def enabled() -> bool:
    """Whether calls go to warm parents (``KVTRACE_CODE_WARM=1``, on Linux)."""
    return os.environ.get(ENV_FLAG, "") == "1" and hasattr(os, "fork") and sys.platform.startswith("linux")


def env_key(environ: dict[str, str]) -> tuple:
    """The part of a call's environment that selects its warm parent."""
    return tuple(sorted((k, v) for k, v in environ.items()
                        if k.startswith(("SGLANG_", "KVTRACE_")) or k in ("PYTHONPATH", "PYTHONHASHSEED")))


class WarmCode:
    """One warm parent (see the module docstring); :meth:`call` runs one call in a fresh child."""

    def __init__(self, environ: dict[str, str]) -> None:
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", "replay.codes.warm"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=sigint_env(dict(environ)),
                                     text=True, bufsize=1)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm process exited ({self.proc.wait()}) before it was ready")
        self.ready = json.loads(line)["ready"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, target: str, kwargs_path: Path, result_path: Path, out_path: Path, err_path: Path,
             environ: dict[str, str], timeout_s: float | None) -> int:
        """Run the call in a child; returns its exit status. Raises TimeoutExpired (the child
        is killed) or RuntimeError (the warm parent is gone)."""
        with self._lock:
            msg = {"call": target, "kwargs": str(kwargs_path), "result": str(result_path), "out": str(out_path),
                   "err": str(err_path), "env": environ, "cwd": os.getcwd()}
            try:
                self.proc.stdin.write(json.dumps(msg) + "\n")
                self.proc.stdin.flush()
                pid = json.loads(self.proc.stdout.readline())["pid"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise RuntimeError(f"the warm process is gone ({e})") from None
            if timeout_s is not None and not wait_readable(self.proc.stdout, timeout_s):
                _kill(pid)
                self.proc.stdout.readline()  # its status, now that it is dead
                raise subprocess.TimeoutExpired(target, timeout_s)
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the warm process exited during a call")
            return int(json.loads(line)["status"])

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_WARM: dict[tuple, WarmCode] = {}
_WARM_LOCK = threading.Lock()


def warm_for(environ: dict[str, str]) -> WarmCode | None:
    """The warm parent for a call with this environment (started now if needed); None when it
    cannot start (the call then runs cold)."""
    key = env_key(environ)
    with _WARM_LOCK:
        w = _WARM.pop(key, None)
        if w is not None and w.alive():
            _WARM[key] = w  # (most recently used last)
            return w
        try:
            cap = max(1, int(os.environ.get("KVTRACE_CODE_WARM_MAX", DEFAULT_MAX)))
        except ValueError:
            cap = DEFAULT_MAX
        while len(_WARM) >= cap:
            _WARM.pop(next(iter(_WARM))).close()
        try:
            w = _WARM[key] = WarmCode(environ)
        except (OSError, RuntimeError, ValueError, KeyError):
            _WARM.pop(key, None)
            return None
        return w


@atexit.register
def close_all() -> None:
    """Let every warm parent of this process exit."""
    with _WARM_LOCK:
        for w in _WARM.values():
            w.close()
        _WARM.clear()


# ------------------------------------------------------------------ the warm process itself
#: the SIGINT handler of each forked child (``serve`` sets it: ``replay.procs.ignore_sigint``)
_CHILD_SIGINT = signal.default_int_handler


def _child(msg: dict, parent: int) -> None:
    code = 1
    try:
        # Ctrl-C stops the run, unless the caller ignores SIGINT (a background job of a script):
        # then the run ignores it too, as a process the caller started itself would
        signal.signal(signal.SIGINT, _CHILD_SIGINT)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
        for fd, path in ((1, msg["out"]), (2, msg["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(msg["env"])
        import tempfile

        tempfile.tempdir = None  # the call's TMPDIR, not the one the parent's imports cached
        os.chdir(msg["cwd"])
        from replay.codes.entry import _call

        code = _call(msg["call"], msg["kwargs"], msg["result"])
    except BaseException:  # noqa: BLE001 - the parent finds no result and reports the status
        import traceback

        traceback.print_exc()
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def serve() -> int:
    """The warm process: bootstrap, preload, then one forked child per call line."""
    import importlib

    global _CHILD_SIGINT
    _CHILD_SIGINT = ignore_sigint()
    out = os.fdopen(os.dup(1), "w")  # the protocol's own fd: nothing an import prints lands there
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from replay.codes.bootstrap import bootstrap

    bootstrap()
    skipped = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the call meets the same error and reports it
            skipped.append(name)
    out.write(json.dumps({"ready": {"pid": os.getpid(), "skipped": skipped}}) + "\n")
    out.flush()
    me = os.getpid()
    for line in sys.stdin:
        msg = json.loads(line)
        if threading.active_count() != 1:  # a fork with live threads could deadlock the child
            out.write(json.dumps({"pid": -1}) + "\n" + json.dumps({"status": 1}) + "\n")
            out.flush()
            continue
        out.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            out.close()
            _child(msg, me)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out.write(json.dumps({"status": rc}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
