"""Process helpers shared by the sweep's zygote (``replay.runs.zygote``) and the warm code
processes (``replay.codes.warm``): waiting on a pipe without ``select``'s fd limit, and a
forked child that dies with its parent."""

from __future__ import annotations

import select
import signal

_PR_SET_PDEATHSIG = 1


def wait_readable(fd, timeout_s: float | None) -> bool:
    """``fd`` (a descriptor or an object with ``fileno()``) readable, or at EOF, within
    ``timeout_s`` (None: wait); ``poll``, since ``select`` refuses fds >= 1024."""
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(p.poll(None if timeout_s is None else int(timeout_s * 1000)))


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux; elsewhere
    nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


__all__ = ["die_with_parent", "wait_readable"]
