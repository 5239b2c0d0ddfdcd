"""A plan's one-pass bound, computed in a child process beside its replays.

The bound (the one-pass LRU curve of the full pool at the largest full pool a plan tries,
:func:`replay.analysis.capacity.capacity_curve`: no split's hits exceed it) takes ~5 s on an hour
of traffic; the plan reads it only where its stop rule first needs it, so it runs while the splits
replay. In a process, not a thread: a plan stopped by a signal kills it at once, and no thread is
left inside native code (Polars, Arrow) when the interpreter exits. Python ends such a daemon
thread with ``pthread_exit`` once finalization starts, and that forced unwind through a C++ frame
aborted an interrupted plan ("terminate called without an active exception", exit -6 instead of
130; CI stop 46).

``python -m replay.runs.one_pass SOURCE FULL_TOKENS`` prints the hit ratio at ``FULL_TOKENS``
(exit 1, nothing printed, where the one-pass curve cannot read ``SOURCE``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: the bound where the one-pass curve cannot read the source: no early stop
NO_BOUND = 1.0


class OnePassBound:
    """The bound at ``full_tokens`` of ``source``, started now; :meth:`result` waits for it,
    :meth:`close` kills it if it still runs (a context manager closes on exit)."""

    def __init__(self, source: Path, full_tokens: int) -> None:
        from replay.procs import child_env

        self._value: float | None = None
        self._proc = subprocess.Popen([sys.executable, "-m", "replay.runs.one_pass", str(Path(source).resolve()),
                                       str(int(full_tokens))], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, env=child_env())

    def result(self) -> float:
        if self._value is None:
            out, _ = self._proc.communicate()
            try:
                self._value = float(out.split()[-1]) if self._proc.returncode == 0 else NO_BOUND
            except (ValueError, IndexError):
                self._value = NO_BOUND
        return self._value

    def close(self) -> None:
        if self._proc.poll() is None:  # still computing: the plan no longer needs it
            self._proc.kill()
            self._proc.wait()
        if not self._proc.stdout.closed:
            self._proc.stdout.close()

    def __enter__(self) -> OnePassBound:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from replay.analysis.capacity import capacity_curve

    try:
        value = float(capacity_curve(args[0]).at(int(args[1])))
    except Exception:  # noqa: BLE001 - a source the one-pass curve cannot read: the caller's NO_BOUND
        return 1
    print(repr(value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
