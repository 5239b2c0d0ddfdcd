"""A warm parent for a sweep's runs: ``python -m replay.runs.zygote BACKEND``.

It imports sglang and replay once (:func:`replay.runs.worker.preload`: imports only, no patch
and no hook) and then forks one fresh child per run; the child applies its run's patches and
hooks in its own address space, runs, writes its result and exits, so runs stay as isolated as
cold processes while none pays the import (seconds of CPU per run). Linux only
(:mod:`replay.runs.pool` starts cold processes elsewhere).

Protocol, one JSON object a line:

- parent -> zygote (stdin): ``{"run": ID, "job": JOB.json, "log": RUN.log}``; before the runs,
  optionally ``{"warm": {"source": DIR, "page_sizes": [N, ...], "workers": W, "scratch": DIR}}``:
  read the source and key its requests once (``replay.runs.worker.warm``, keyed by W processes
  whose shares pass through ``scratch``), so the children forked after it start from them
- zygote -> parent (stdout): ``{"ready": {...}}`` once, then per run ``{"started": ID, "pid": N}``
  and ``{"exited": ID, "status": S}`` (``S`` as ``Popen.returncode``: negative for a signal),
  or ``{"exited": ID, "status": null, "error": ...}`` when the fork failed; per warm
  ``{"warmed": {...}}`` or ``{"warmed": null, "error": ...}``.

Threads: the zygote never starts a Python thread and checks before each fork that only its main
thread exists; of the native threads its imports leave (numpy's OpenBLAS pool, pyarrow's jemalloc
background thread, an idle torch helper) each library re-arms itself in a forked child. polars,
whose thread pool is not fork-safe, is not imported here (children import it for their summary).

Signals: the zygote ignores SIGINT (Ctrl-C reaches the terminal's whole process group: the sweep
and each child handle it; the sweep then stops the zygote). On SIGTERM or end of stdin (the sweep
is gone) it sends SIGTERM to its live children, kills them after 10 s, reaps them and exits. Each
child dies with the zygote (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from replay.procs import die_with_parent, ignore_sigint, wait_readable

_STOP = False
_WARMING = False  # inside ``_warm``: SIGTERM ends the zygote at once (no child forked yet to stop)
_IMPORTING = True  # until ``ready``: SIGTERM ends the zygote at once too (seconds of imports to abandon)


#: seconds a child has to exit after SIGTERM before it is killed
TERM_GRACE_S = 10.0


def _send(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


#: the SIGINT handler of each forked child (``serve`` sets it: ``replay.procs.ignore_sigint``)
_CHILD_SIGINT = signal.default_int_handler


def _child(job: str, log: str, proto_fd: int, cmd_fd: int, parent_pid: int) -> None:
    """In the forked child: own signals, stdio to the run's log, run the job, never return."""
    rc = 1
    try:
        # Ctrl-C stops the run, unless the caller ignores SIGINT (a background job of a script):
        # then the run ignores it too, as a process the caller started itself would
        signal.signal(signal.SIGINT, _CHILD_SIGINT)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent_pid:  # the zygote died before the line above
            os._exit(1)
        t0, cpu0 = time.perf_counter(), time.process_time()
        os.close(proto_fd)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, cmd_fd)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        from pathlib import Path

        from replay.runs.worker import run_job

        rc = run_job(Path(job), t0=t0, cpu0=cpu0)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        rc = 130
    except BaseException:  # noqa: BLE001 - reported through the exit status and the log
        import traceback

        traceback.print_exc()
        rc = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(rc)


def _fork(run: str, job: str, log: str, proto_fd: int, cmd_fd: int) -> int:
    """Fork the child of one run (signals blocked across the fork so no handler of ours runs there)."""
    if threading.active_count() != 1:
        raise RuntimeError(f"refusing to fork with {threading.active_count()} Python threads alive")
    sys.stdout.flush()
    sys.stderr.flush()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    me = os.getpid()
    try:
        pid = os.fork()
        if pid == 0:
            _child(job, log, proto_fd, cmd_fd, me)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return pid


def _warm(spec: dict, proto_fd: int) -> None:
    """Keep the sweep's source read and its page keys computed (``replay.runs.worker.warm``) for
    the children forked after this; reply ``{"warmed": {...}}`` (``{"warmed": null, "error": ...}``
    when it could not: the runs then read and key it themselves, and meet any error themselves)."""
    import gc

    from replay.runs.worker import warm

    global _WARMING
    _WARMING = True
    try:
        info = warm(spec["source"], spec.get("page_sizes") or (), workers=int(spec.get("workers") or 1),
                    scratch=spec.get("scratch"))
    except Exception as e:  # noqa: BLE001 - the runs go on without it
        _send(proto_fd, {"warmed": None, "error": f"{type(e).__name__}: {e}"})
        return
    finally:
        _WARMING = False
    if "polars" in sys.modules:  # its thread pool is not fork-safe: no more forks from here
        print("kvtrace zygote: polars got imported while warming; stopping", file=sys.stderr)
        raise SystemExit(2)
    gc.collect()
    gc.freeze()
    _send(proto_fd, {"warmed": info})


def _on_term(signum, frame) -> None:
    global _STOP
    _STOP = True
    if _WARMING or _IMPORTING:  # seconds of keying or imports to abandon; keying workers die with it
        raise SystemExit(128 + signum)


def _stop_children(children: dict[int, str], proto_fd: int) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + TERM_GRACE_S
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                for p in children:
                    os.kill(p, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)
            continue
        run = children.pop(pid, None)
        if run is not None:
            try:
                _send(proto_fd, {"exited": run, "status": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass


def serve(backend: str) -> int:
    """The zygote's main loop (stdin: commands, fd 1: replies; see the module docstring)."""
    global _CHILD_SIGINT, _IMPORTING
    _CHILD_SIGINT = ignore_sigint()
    signal.signal(signal.SIGTERM, _on_term)
    die_with_parent(signal.SIGTERM)
    cmd_fd, proto_fd = 0, os.dup(1)
    os.dup2(2, 1)  # stray prints of the imports go to our log, not into the protocol
    t0, cpu0 = time.perf_counter(), time.process_time()
    from replay.runs.worker import preload

    skipped = preload(backend)
    if "polars" in sys.modules:
        print("kvtrace zygote: polars got imported; its thread pool is not fork-safe", file=sys.stderr)
        return 2
    import gc

    gc.collect()
    gc.freeze()  # children's collections skip the imported heap (no traversal, fewer copy-on-write pages)
    _IMPORTING = False
    threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    _send(proto_fd, {"ready": {"pid": os.getpid(), "import_s": round(time.perf_counter() - t0, 3),
                               "import_cpu_s": round(time.process_time() - cpu0, 3), "modules": len(sys.modules),
                               "skipped": skipped, "native_threads": threads}})
    children: dict[int, str] = {}
    buf = b""
    eof = False
    while not (_STOP or (eof and not children)):
        if not eof:
            if wait_readable(cmd_fd, 0.05):
                data = os.read(cmd_fd, 65536)
                eof = not data
                buf += data
        else:
            time.sleep(0.05)
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            msg = json.loads(line)
            if "warm" in msg:
                _warm(msg["warm"], proto_fd)
                continue
            try:
                pid = _fork(msg["run"], msg["job"], msg["log"], proto_fd, cmd_fd)
            except (OSError, RuntimeError) as e:
                _send(proto_fd, {"exited": msg["run"], "status": None, "error": f"{type(e).__name__}: {e}"})
                continue
            children[pid] = msg["run"]
            _send(proto_fd, {"started": msg["run"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            run = children.pop(pid, None)
            if run is not None:
                _send(proto_fd, {"exited": run, "status": os.waitstatus_to_exitcode(status)})
        if eof and children:  # the sweep is gone: its runs go with it
            break
    _stop_children(children, proto_fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1] if len(sys.argv) > 1 else "sglang"))
