"""Process helpers shared by the sweep's zygote (``replay.runs.zygote``) and the warm code
processes (``replay.codes.warm``): waiting on a pipe without ``select``'s fd limit, and a
forked child that dies with its parent."""

from __future__ import annotations

import os
import select
import signal

_PR_SET_PDEATHSIG = 1


def wait_readable(fd, timeout_s: float | None) -> bool:
    """``fd`` (a descriptor or an object with ``fileno()``) readable, or at EOF, within
    ``timeout_s`` (None: wait); ``poll``, since ``select`` refuses fds >= 1024."""
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(p.poll(None if timeout_s is None else int(timeout_s * 1000)))


#: set in a helper process's environment when its caller ignores SIGINT
SIGINT_IGNORED_ENV = "KVTRACE_CALLER_IGNORES_SIGINT"


def sigint_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` (changed in place) for a helper process this one starts, saying whether this one
    ignores SIGINT: ``exec`` passes an ignored SIGINT on only when it is ignored at the C level,
    and a native library may hold SIGINT there while Python ignores it (a shell ignores SIGINT
    for a script's background job, so such a job must not lose its runs to a Ctrl-C meant for
    the foreground)."""
    if caller_ignores_sigint():
        env[SIGINT_IGNORED_ENV] = "1"
    else:
        env.pop(SIGINT_IGNORED_ENV, None)
    return env


def child_env() -> dict[str, str]:
    """The environment of a ``python -m replay...`` helper this process starts: this one's, with
    its ``sys.path`` as ``PYTHONPATH`` (the helper imports what this one does) and
    :func:`sigint_env`'s mark."""
    import sys

    return sigint_env(dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))


def caller_ignores_sigint() -> bool:
    """Whether SIGINT is ignored here, or was where the process that started this one ran."""
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN or os.environ.get(SIGINT_IGNORED_ENV) == "1"


def ignore_sigint():
    """Ignore SIGINT in this (parent) process, and return the handler its forked children should
    install: KeyboardInterrupt, or ``SIG_IGN`` where this process's caller ignores SIGINT
    (``sigint_env``), so a child is as deaf to Ctrl-C as the process that asked for it."""
    ignored = caller_ignores_sigint()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return signal.SIG_IGN if ignored else signal.default_int_handler


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux; elsewhere
    nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


__all__ = ["SIGINT_IGNORED_ENV", "caller_ignores_sigint", "die_with_parent", "ignore_sigint", "sigint_env",
           "wait_readable"]
