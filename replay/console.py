"""Keep third-party output off the terminal: sglang's log lines, Python warnings and whatever a
library writes to file descriptors 1 and 2 go to a log file; kvtrace's progress bars still draw
on the terminal.

``third_party_to_log(final_path)`` is used around the long commands (``record``, ``replay``,
``sweep``, ``doctor --replay``). While active, ``sys.stdout``/``sys.stderr`` and descriptors 1
and 2 point at a temporary log file (so ``logging`` handlers created meanwhile, e.g. by sglang's
``logging.basicConfig(force=True)`` in its Scheduler, warnings, C-level writes and child
processes all land there), and :func:`progress_stream` returns the terminal's stderr. On exit the
streams are restored, logging handlers left pointing at the log are pointed back at stderr, and
the log is moved to ``final_path`` (appended when one is there) if its directory exists and the
log is not empty; :attr:`Capture.path` then names it (``None``: nothing was logged).

kvtrace's own warnings and errors (loggers under ``kvtrace``, e.g. the recorder's "recording ...
disabled after a write error") still reach the terminal, and the log too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

_TERMINAL: io.TextIOBase | None = None


def progress_stream():
    """Where a progress bar draws: the terminal's stderr while output is captured, else stderr."""
    return _TERMINAL if _TERMINAL is not None else sys.stderr


def no_progress_monitor() -> None:
    """Keep tqdm from starting its monitor thread (``tqdm.monitor_interval = 0``, tqdm's own
    switch; the bars here set ``mininterval`` and need none): a replay's process stays
    single-threaded, so the reference backend may fork the process that keys its requests
    (:mod:`replay.backends.reference.keystream`)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0


class Capture:
    """The outcome of :func:`third_party_to_log`: ``path`` of the kept log (or ``None``)."""

    def __init__(self) -> None:
        self.path: Path | None = None


def _fd(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


@contextlib.contextmanager
def third_party_to_log(final_path: str | Path | None, *, verbose: bool = False):
    """Route third-party output to a log file (see the module docstring); ``verbose``: do nothing."""
    global _TERMINAL
    cap = Capture()
    if verbose or _TERMINAL is not None:  # verbose, or already inside a capture
        yield cap
        return
    fd, tmp = tempfile.mkstemp(prefix="kvtrace-", suffix=".log")
    log = open(fd, "a", buffering=1, encoding="utf-8", errors="replace")
    old_out, old_err = sys.stdout, sys.stderr
    for s in (old_out, old_err):
        with contextlib.suppress(Exception):
            s.flush()
    saved = {n: os.dup(n) for n in (1, 2)}
    terminal_fd = _fd(old_err)
    _TERMINAL = (os.fdopen(os.dup(terminal_fd), "w", buffering=1, encoding="utf-8", errors="replace")
                 if terminal_fd is not None else old_err)
    ours = logging.StreamHandler(_TERMINAL)
    ours.setLevel(logging.WARNING)
    ours.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("kvtrace").addHandler(ours)
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        yield cap
    finally:
        with contextlib.suppress(Exception):
            log.flush()
        for n, d in saved.items():
            os.dup2(d, n)
            os.close(d)
        sys.stdout, sys.stderr = old_out, old_err
        logging.getLogger("kvtrace").removeHandler(ours)
        _repoint_handlers(log, old_err)
        if _TERMINAL is not old_err:
            with contextlib.suppress(Exception):
                _TERMINAL.close()
        _TERMINAL = None
        log.close()
        cap.path = _keep(Path(tmp), Path(final_path) if final_path else None)


def _repoint_handlers(log, stream) -> None:
    """Logging handlers created while captured write to ``log``: point them at ``stream``."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is log:
                h.setStream(stream)


def _keep(tmp: Path, final: Path | None) -> Path | None:
    try:
        if tmp.stat().st_size == 0:
            tmp.unlink()
            return None
        if final is None or not final.parent.is_dir():
            return tmp  # no output directory (refused before it was made): the log stays in /tmp
        if final.exists():
            with open(final, "ab") as dst, open(tmp, "rb") as src:
                shutil.copyfileobj(src, dst)
            tmp.unlink()
        else:
            shutil.move(str(tmp), str(final))
        return final
    except OSError:
        return tmp if tmp.exists() else None


__all__ = ["Capture", "no_progress_monitor", "progress_stream", "third_party_to_log"]
