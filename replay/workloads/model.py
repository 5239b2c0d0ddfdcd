"""The one in-memory workload: arrival rows as columns, and as request objects for a backend.

``Workload`` is what every consumer gets from ``read_workload`` (generators' output, imports,
recorded or captured traces alike): ``columns`` (numpy, for statistics and export) and
``requests`` (a tuple of :class:`WorkloadRequest`, built on first use, for the backends).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from replay.workloads.errors import WorkloadError
from tracer.schema.hashing import page_hash_of


@dataclass(frozen=True)
class RequestColumns:
    """Arrival rows of a workload as numpy columns (row i = i-th arrival).

    ``page_hashes`` is flat: row i owns ``page_hashes[hash_offsets[i]:hash_offsets[i+1]]``.
    ``rid`` None means 0..N-1 in arrival order (what the writer assigns then).
    """

    ts_ns: np.ndarray  # int64
    session_id: np.ndarray  # int64
    turn: np.ndarray  # int32
    input_len: np.ndarray  # int32
    output_len: np.ndarray  # int32
    max_new_tokens: np.ndarray  # int32
    page_hashes: np.ndarray  # uint64, flat
    hash_offsets: np.ndarray  # int64, len = rows + 1
    rid_str: list[str] | None = None
    rid: np.ndarray | None = None  # int64

    @property
    def num_requests(self) -> int:
        return len(self.ts_ns)

    def hashes_of(self, i: int) -> np.ndarray:
        """Page hashes of row ``i``."""
        return self.page_hashes[self.hash_offsets[i] : self.hash_offsets[i + 1]]

    def rids(self) -> np.ndarray:
        """Request numbers (``rid``, or 0..N-1 when None)."""
        if self.rid is None:
            return np.arange(self.num_requests, dtype=np.int64)
        return np.asarray(self.rid, dtype=np.int64)


@dataclass(frozen=True)
class WorkloadRequest:
    """One arriving request, as a backend serves it.

    Attributes:
        rid: request number (unique in the workload).
        arrival_ns: arrival time on the workload clock.
        session_id, turn: conversation position (-1 when unknown).
        input_len: prompt tokens.
        output_len: tokens to generate (the row's, clamped to [1, max_new_tokens]; the
            row's -1 (unknown) becomes ``max_new_tokens``).
        max_new_tokens: generation cap the scheduler budgets with (a row's <= 0 becomes
            ``max(output_len, 1)``).
        page_hashes: chained hash per ``hash_block_tokens`` block of the prompt.
        rid_str: server request id, '' when none.
    """

    rid: int
    arrival_ns: int
    session_id: int
    turn: int
    input_len: int
    output_len: int
    max_new_tokens: int
    page_hashes: np.ndarray
    rid_str: str = ""


@dataclass(frozen=True)
class Workload:
    """A workload read from disk: its manifest and arrival rows sorted by (ts_ns, seq).

    Attributes:
        path: the trace/workload directory.
        manifest: its ``manifest.json``.
        hash_block_tokens: tokens per page hash.
        columns: the arrival rows as numpy columns.
        table: stored REQUEST columns of the arrival rows (enum columns as strings), after the
            completion described in ``io.read_workload`` (``assumed`` names what was filled in).
        rank: the rank whose requests these are.
        assumed: documented defaults applied because the trace lacked the value, e.g.
            ``"output_len<-finish"``, ``"turn<-session order"``, ``"hash_block_tokens=16"``.
    """

    path: Path
    manifest: dict
    hash_block_tokens: int
    columns: RequestColumns
    table: pa.Table
    rank: int = 0
    assumed: tuple[str, ...] = ()

    @property
    def num_requests(self) -> int:
        return self.columns.num_requests

    @property
    def page_hash(self) -> str:
        """Name of the page-hash function of ``page_hashes`` (manifest ``page_hash``)."""
        return page_hash_of(self.manifest)

    @cached_property
    def requests(self) -> tuple[WorkloadRequest, ...]:
        """The rows as :class:`WorkloadRequest` objects, in arrival order.

        Raises:
            WorkloadError: a row with ``input_len <= 0`` or two rows with one ``rid``.
        """
        c = self.columns
        rids = c.rids().tolist()
        if len(set(rids)) != len(rids):
            dup = next(r for r in rids if rids.count(r) > 1)
            raise WorkloadError(f"{self.path}: two arrival rows for rid {dup}; expected one per request")
        out = []
        rid_str = c.rid_str or [""] * c.num_requests
        for i, (rid, ts, sid, turn, inp, outl, mx) in enumerate(zip(
                rids, c.ts_ns.tolist(), c.session_id.tolist(), c.turn.tolist(), c.input_len.tolist(),
                c.output_len.tolist(), c.max_new_tokens.tolist())):
            if inp <= 0:
                raise WorkloadError(f"{self.path}: request row {i} (rid {rid}) has input_len {inp}; "
                                    "expected a positive prompt length")
            if mx <= 0:
                mx = max(outl, 1)
            outl = mx if outl < 0 else max(1, min(outl, mx))
            out.append(WorkloadRequest(rid, ts, sid, turn, inp, outl, mx, c.hashes_of(i), rid_str[i] or ""))
        return tuple(out)

    @property
    def max_seq_tokens(self) -> int:
        """Longest prompt + generation cap of any request (0 when empty)."""
        c = self.columns
        if not c.num_requests:
            return 0
        mx = np.where(c.max_new_tokens > 0, c.max_new_tokens, np.maximum(c.output_len, 1))
        return int((c.input_len.astype(np.int64) + mx).max())
