"""Whether the interpreter is inside the recorder's bookkeeping, for a signal handler that must not
raise there: an emit issues its seq and then keeps its row, so an exception raised between the two
(an asynchronous ``KeyboardInterrupt``) loses an event no counter sees. A handler that finds
:func:`in_recorder` true defers its exception until the frame stack has left the recorder."""

from __future__ import annotations

import os
from types import FrameType

_CORE_DIR = os.path.dirname(os.path.realpath(__file__))
# The files whose frames hold the accounting half-done: the generated emits (compiled under
# ``<kvtrace ...>`` names), the recorder's buffers, accounting and ends. The hooks under
# ``tracer/sglang`` are not in it: they wrap the server's own methods, which may run for long.
_CORE_FILES = frozenset(os.path.join(_CORE_DIR, f) for f in (
    "recorder.py", "buffers.py", "lifecycle.py", "drain.py", "drain_link.py", "chunks.py", "segments.py",
    "writer.py", "emitgen.py", "__init__.py"))


def in_recorder(frame: FrameType | None) -> bool:
    """True when ``frame`` or a caller of it runs an emit or the recorder's own code."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<kvtrace") or (name.endswith(".py") and os.path.realpath(name) in _CORE_FILES):
            return True
        frame = frame.f_back
    return False


__all__ = ["in_recorder"]
