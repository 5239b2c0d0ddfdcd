"""The recorder's open-segment writer (Arrow IPC stream appended with ``os.write``).

Layout, encoding and recovery live in ``tracer.schema.storage`` (the on-disk contract).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from tracer.schema import Family
from tracer.schema.storage import (  # noqa: F401  (re-exported for the recorder and callers)
    ARROW_POOL,
    OPEN_SUFFIX,
    convert_segment,
    family_dir,
    next_part_index,
    part_name,
    recover_segment,
    write_family_table,
)


MESSAGE_ROWS = 1 << 16  # rows per IPC record-batch message (one GIL hold each)


class StreamSegment:
    """An open segment: an Arrow IPC stream appended with ``os.write``.

    The schema message is written at open and one record-batch message per flush, through a
    plain file descriptor opened ``O_APPEND`` (no writer object whose finalizer could write an
    end-of-stream marker, e.g. in a forked child). A crash leaves a stream whose complete
    batches are all recoverable.
    """

    def __init__(self, trace_dir: str | os.PathLike, fam: Family, rank: int):
        self.fam = fam
        self.schema = fam.arrow_schema(stored=False)
        self.dir = family_dir(trace_dir, fam.name, rank)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = next_part_index(self.dir)
        self.path = self.dir / part_name(self.index, OPEN_SUFFIX)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.num_rows = 0
        self.num_bytes = 0
        self._write(self.schema.serialize(memory_pool=ARROW_POOL))

    def _write(self, buf) -> None:
        view = memoryview(buf)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.num_bytes += len(buf)

    def write(self, batch: pa.RecordBatch, between_steps=None) -> None:
        """Append ``batch`` as record-batch messages of at most ``MESSAGE_ROWS`` rows each.

        ``RecordBatch.serialize`` holds the GIL (about 6 ms for a million rows), so a large
        flush is cut into messages with ``between_steps`` (the recorder yields the GIL) between
        them; a reader sees the same rows in the same order."""
        n = batch.num_rows
        for off in range(0, max(n, 1), MESSAGE_ROWS):
            if off:
                between_steps and between_steps()
            self._write(batch.slice(off, MESSAGE_ROWS).serialize(memory_pool=ARROW_POOL))
        self.num_rows += n

    def abandon(self) -> None:
        """Close the descriptor without touching the file (forked child)."""
        try:
            os.close(self.fd)
        except OSError:
            pass

    def close(self, between_steps=None) -> Path | None:
        """Close the stream and convert it to Parquet. Returns the Parquet path (None if empty).

        ``between_steps`` is called between conversion steps (the recorder yields the GIL)."""
        os.close(self.fd)
        return convert_segment(self.path, self.fam, row_group_rows=1 << 18, between_steps=between_steps)


__all__ = ["MESSAGE_ROWS", "StreamSegment",
           # re-exported from tracer.schema.storage (the recorder writes the drops table through this module)
           "ARROW_POOL", "OPEN_SUFFIX", "convert_segment", "family_dir", "next_part_index", "part_name",
           "recover_segment", "write_family_table"]
