"""Close the trace of a server process that sglang kills with its parent (``PR_SET_PDEATHSIG``).

sglang's scheduler (and DP controller) processes call ``kill_itself_when_parent_died()``: the
kernel sends them SIGKILL when their parent exits. A server stopped by SIGTERM therefore SIGKILLs
every recording scheduler, whose open segments stay behind as a "crashed" trace (found by the
live-server tests, tests/live). When recording starts in such a process, :func:`arm` takes the
death signal over: it clears ``PDEATHSIG`` and starts a daemon thread that waits for the parent
to exit (``pidfd`` when available, else polling ``getppid``), stops the recorder (the rank ends
``complete``: everything the process recorded was flushed) and then SIGKILLs its own process,
exactly what the kernel would have done. A process without a death signal is left alone.

Linux only (elsewhere :func:`arm` does nothing). Never raises.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

from tracer.fdwait import wait_readable

log = logging.getLogger("kvtrace.sglang")

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2
POLL_S = 0.2


class _Armed:
    """Whether this process's watcher runs (reset in a forked child)."""

    value = False


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def death_signal() -> int:
    """This process's parent-death signal (0: none)."""
    sig = ctypes.c_int(0)
    if _libc().prctl(_PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0) != 0:
        return 0
    return sig.value


def _wait_parent_exit(parent: int) -> None:
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        fd = None
    try:
        while os.getppid() == parent:
            if fd is not None:
                wait_readable(fd, 5.0)
            else:
                threading.Event().wait(POLL_S)
    finally:
        if fd is not None:
            os.close(fd)


def _watch(parent: int, sig: int) -> None:
    try:
        _wait_parent_exit(parent)
        import tracer

        tracer.stop("complete")
    except Exception as e:  # pragma: no cover - best effort
        sys.stderr.write(f"kvtrace: closing the trace after the parent exited failed: {e!r}\n")
    finally:
        os.kill(os.getpid(), sig)


def arm() -> bool:
    """Take over this process's parent-death signal (see the module docstring).

    Returns:
        True when a watcher now runs (the process had a death signal and this is Linux).
    """
    if _Armed.value or not sys.platform.startswith("linux"):
        return False
    try:
        sig = death_signal()
        if sig == 0:
            return False
        parent = os.getppid()
        if _libc().prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0) != 0:
            return False
        if os.getppid() != parent:  # the parent exited while we switched
            os.kill(os.getpid(), sig)
        threading.Thread(target=_watch, args=(parent, sig), name="kvtrace-parent-watch",
                         daemon=True).start()
        _Armed.value = True
        return True
    except Exception as e:
        log.warning("kvtrace: parent-death watch not armed: %r", e)
        return False


def _after_fork_in_child() -> None:
    _Armed.value = False  # PDEATHSIG is cleared in a forked child; its own arm() decides again


os.register_at_fork(after_in_child=_after_fork_in_child)
