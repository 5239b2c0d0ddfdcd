"""The offline side's exception types (one per layer) and their command-line exit codes.

Layers and their types:

- ``tracer.schema.SchemaError``: the on-disk contract is broken (a manifest that is not an object,
  a column of the wrong type, an unknown family); raised by the schema package.
- ``replay.errors.KvtraceError``: anything the offline tools refuse or cannot do, with a message
  naming the file, row or setting and what was expected. Subclasses: ``TraceError``
  (``replay.trace``), ``WorkloadError`` (``replay.workloads``), ``DataLostError`` (something was
  lost or could not be kept; exit status 1) and ``Interrupted`` (SIGINT/SIGTERM).

The ``kvtrace`` command (``replay.cli``) turns these into ``kvtrace: error: ...`` lines with exit
status ``exit_code``; ``kvtrace --debug ...`` shows the traceback instead. This module imports
nothing heavy so every layer can use it.
"""

from __future__ import annotations

EXIT_LOST = 1  # something was lost, a check failed, or data could not be kept
EXIT_REFUSED = 2  # bad input or a refused operation: nothing was changed
EXIT_INTERNAL = 3  # an unexpected exception (a bug): run with --debug for the traceback


class KvtraceError(Exception):
    """A refused operation or bad input; the message names file/row/setting and the expectation."""

    exit_code = EXIT_REFUSED


class DataLostError(KvtraceError):
    """Something was lost or could not be kept (a failed recording, an unreadable segment)."""

    exit_code = EXIT_LOST


class Interrupted(KvtraceError):
    """The command was stopped by a signal; what was recorded so far is kept and marked."""

    def __init__(self, signal_name: str, message: str = ""):
        self.signal_name = signal_name
        super().__init__(message or f"interrupted by {signal_name}")

    @property
    def exit_code(self) -> int:  # the shell convention, 128 + signal number
        import signal

        return 128 + int(getattr(signal, self.signal_name, signal.SIGINT))


def signal_of(e: KeyboardInterrupt) -> str:
    """The signal that stopped a command: the name the CLI's handler put in the KeyboardInterrupt
    (``SIGTERM``), else ``SIGINT`` (Python's own Ctrl-C)."""
    return e.args[0] if e.args and str(e.args[0]).startswith("SIG") else "SIGINT"


__all__ = ["KvtraceError", "DataLostError", "Interrupted", "EXIT_LOST", "EXIT_REFUSED", "EXIT_INTERNAL", "signal_of"]
