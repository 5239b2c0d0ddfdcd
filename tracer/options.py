"""The recorder's settings (``tracer.start``'s options), saved with every recording.

Its own module so that the recorder and the drain process (``tracer.drain``) share it without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecorderOptions:
    """Recorder settings (saved in ``ranks/rank=<r>.json`` and the manifest's ``options``)."""

    buffer_events: int = 1 << 16  # records per struct-family buffer (current + up to 2 spare)
    row_buffer_events: int = 1 << 16  # rows per row-family buffer
    flush_interval_ms: int = 1000
    poll_interval_ms: int = 50  # flusher wake-up to check fill levels
    segment_max_bytes: int = 64 << 20  # rotate the open segment past this size...
    segment_max_s: float = 600.0  # ...or this age
    detail: str = "counts"  # "steps" (request/step/stats rows) | "counts" | "pages" (+ page ids)
    clock: str = "step"  # "step" | "event" | "manual"
    on_fork: str = "off"  # "off" (child records nothing) | "child" (child gets its own rank)
    stop_timeout_s: float = 10.0
    # "process": a drain process converts and writes (tracer.drain), the server's interpreter
    # only fills shared buffers; "thread": the in-process flusher thread does it all.
    flusher: str = "thread"

    def __post_init__(self):
        if self.detail not in ("steps", "counts", "pages"):
            raise ValueError(f"detail must be 'steps', 'counts' or 'pages', got {self.detail!r}")
        if self.clock not in ("step", "event", "manual"):
            raise ValueError(f"clock must be 'step', 'event' or 'manual', got {self.clock!r}")
        if self.on_fork not in ("off", "child"):
            raise ValueError(f"on_fork must be 'off' or 'child', got {self.on_fork!r}")
        if self.flusher not in ("process", "thread"):
            raise ValueError(f"flusher must be 'process' or 'thread', got {self.flusher!r}")
        if self.buffer_events < 16 or self.row_buffer_events < 16:
            raise ValueError("buffer_events and row_buffer_events must be >= 16")


__all__ = ["RecorderOptions"]
