"""The local executor of ``kvtrace sweep``: one process per run, at most ``jobs`` at a time.

On Linux the processes are children forked by a warm zygote (:mod:`replay.runs.zygote`), which
imports sglang and replay once for the whole sweep; elsewhere, or when the zygote cannot start,
each run is a cold ``python -m replay.runs.worker`` that imports them itself. Either way a run's
patches and hooks live and die with its own process, its output goes to
``RUNS/.partial/<run>.log`` and its result to ``RUNS/.partial/<run>.result.json``.

Runs start in the sweep's order. (Longest-first would need an estimate; on the bench's 4 runs the
record CPU of baseline and swa-fixes runs differs by less than the noise between repeats.)

An interrupt (``KeyboardInterrupt`` here: SIGINT, or SIGTERM through the CLI) stops every
running child at once: SIGTERM, then SIGKILL after 10 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from replay.console import progress_stream
from replay.runs.jobs import PARTIAL_DIR
from replay.runs.jobs import job_result as _job_result
from replay.procs import child_env, wait_readable

ZYGOTE_LOG = "zygote.log"
#: what the zygote reported when ready: pid, import seconds (wall, CPU), modules, native threads
ZYGOTE_INFO = "zygote.json"
#: seconds the zygote may take to import sglang and replay before the sweep gives up on it
ZYGOTE_START_TIMEOUT_S = 600.0


class ColdLauncher:
    """Each run a fresh ``python -m replay.runs.worker JOB.json`` (imports everything itself)."""

    kind = "cold"

    def __init__(self) -> None:
        self.procs: dict[str, tuple[subprocess.Popen, object]] = {}

    def start(self, run: str, job: Path, log: Path) -> None:
        fh = open(log, "w")
        proc = subprocess.Popen([sys.executable, "-m", "replay.runs.worker", str(job)], stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT, env=child_env())
        self.procs[run] = (proc, fh)

    def finished(self, timeout: float) -> list[tuple[str, int]]:
        time.sleep(timeout)
        done = [(run, p.returncode) for run, (p, _) in self.procs.items() if p.poll() is not None]
        for run, _ in done:
            self.procs.pop(run)[1].close()
        return done

    def stop(self) -> None:
        for proc, _ in self.procs.values():
            proc.terminate()
        for proc, fh in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            fh.close()
        self.procs.clear()

    def close(self) -> None:
        """End of the sweep: nothing left running."""


class ZygoteError(RuntimeError):
    """The zygote did not start (or died); the sweep goes on with cold processes."""


class ZygoteLauncher:
    """Runs forked by one warm zygote process (see :mod:`replay.runs.zygote`)."""

    kind = "zygote"

    def __init__(self, root: Path, backend: str) -> None:
        log = open(root / PARTIAL_DIR / ZYGOTE_LOG, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "replay.runs.zygote", backend], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, env=child_env())
        log.close()
        self.buf = b""
        self.root = root
        self.running: set[str] = set()
        self.ready: dict = {}
        deadline = time.monotonic() + ZYGOTE_START_TIMEOUT_S
        try:
            while not self.ready:
                if time.monotonic() > deadline:
                    raise ZygoteError(f"did not finish its imports in {ZYGOTE_START_TIMEOUT_S:.0f} s")
                for msg in self._read(0.5):
                    self.ready = msg.get("ready", {})
            (root / PARTIAL_DIR / ZYGOTE_INFO).write_text(json.dumps(self.ready))
        except BaseException:
            self.stop()
            raise

    def _read(self, timeout: float) -> list[dict]:
        if not wait_readable(self.proc.stdout, timeout):
            return []
        data = os.read(self.proc.stdout.fileno(), 65536)
        if not data:
            self.proc.wait()
            raise ZygoteError(f"exited with status {self.proc.returncode}")
        self.buf += data
        msgs = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msgs.append(json.loads(line))
        return msgs

    def warm(self, spec: dict) -> None:
        """Have the zygote read the source and key its requests before the runs it forks next
        (``{"source", "page_sizes"}``; see :mod:`replay.runs.zygote`). What it kept goes into
        ``zygote.json`` under ``warm`` when it replies."""
        self._send({"warm": spec})

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as e:
            raise ZygoteError(f"not reachable ({e})") from None

    def start(self, run: str, job: Path, log: Path) -> None:
        self._send({"run": run, "job": str(job), "log": str(log)})
        self.running.add(run)

    def finished(self, timeout: float) -> list[tuple[str, int]]:
        done = []
        for msg in self._read(timeout):
            if "warmed" in msg:
                self.ready["warm"] = msg["warmed"] if msg["warmed"] is not None else {"error": msg.get("error")}
                (self.root / PARTIAL_DIR / ZYGOTE_INFO).write_text(json.dumps(self.ready))
            if "exited" in msg and msg["exited"] in self.running:
                self.running.discard(msg["exited"])
                status = msg["status"]
                done.append((msg["exited"], status if status is not None else -1))
        return done

    def stop(self) -> None:
        """SIGTERM to the zygote (it stops its children), SIGKILL after 15 s (children die with it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        """End of the sweep: end of stdin, and the zygote exits."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.stop()
        self.proc.stdout.close()


def _launcher(root: Path, backend: str):
    if sys.platform == "linux" and hasattr(os, "fork") and os.environ.get("KVTRACE_SWEEP_ZYGOTE", "1") != "0":
        try:
            return ZygoteLauncher(root, backend)
        except ZygoteError as e:
            print(f"kvtrace sweep: the warm zygote {e} (see {root / PARTIAL_DIR / ZYGOTE_LOG}); "
                  "starting a cold process per run", file=progress_stream())  # the terminal, also while sglang output goes to the log
    return ColdLauncher()


def _job_file(root: str, spec) -> Path:
    return Path(root) / PARTIAL_DIR / f"{spec.key.replace('/', '__')}.job.json"


def run_local(args, jobs: int, warm: dict | None = None):
    """Yield each run's result (``{"run", "status", "error", ...}``) as its process ends.

    Args:
        args: ``(source, root, spec, sets, backend, detail)`` per run, in start order.
        jobs: processes at a time.
        warm: ``{"source", "page_sizes"}``: the zygote reads the source and keys its requests
            once, before it forks the runs (:meth:`ZygoteLauncher.warm`; cold processes do not).
    """
    if not args:
        return
    pending, running = list(args), {}
    root, backend = Path(args[0][1]), args[0][4]
    (root / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)
    launcher = _launcher(root, backend)
    try:
        if warm and isinstance(launcher, ZygoteLauncher):  # scratch: cleared by the next sweep
            launcher.warm(warm | {"scratch": str(root / PARTIAL_DIR)})
        while pending or running:
            try:
                while pending and len(running) < jobs:
                    source, root_s, spec, sets, backend, detail = pending[0]
                    job = _job_file(root_s, spec)
                    job.write_text(json.dumps({"source": source, "root": root_s, "policy": spec.policy,
                                               "grid": [list(g) for g in spec.grid], "sets": list(sets),
                                               "backend": backend, "detail": detail, "code": spec.code,
                                               "code_spec": spec.code_spec}))
                    launcher.start(spec.key, job, job.with_suffix("").with_suffix(".log"))
                    running[spec.key] = (spec, job)
                    pending.pop(0)
                done = launcher.finished(0.05)
            except ZygoteError as e:  # the zygote died (its children with it): the rest go cold
                for key in running:
                    yield {"run": key, "status": "failed", "error": f"the sweep's zygote {e} during this run"}
                running.clear()
                launcher.stop()
                print(f"kvtrace sweep: the warm zygote {e} (see {root / PARTIAL_DIR / ZYGOTE_LOG}); "
                      "starting a cold process per run", file=progress_stream())  # the terminal, also while sglang output goes to the log
                launcher = ColdLauncher()
                continue
            for key, status in done:
                spec, job = running.pop(key)
                yield _job_result(spec, job, status)
        launcher.close()
    except BaseException:
        launcher.stop()
        raise


__all__ = ["ColdLauncher", "ZygoteLauncher", "run_local"]
