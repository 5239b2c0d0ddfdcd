"""Workload input of the real-code backend: an adapter over ``replay.workloads``.

The backend serves :class:`replay.workloads.Workload` (the one workload class, read through the
one trace reader); its ``requests`` are :class:`replay.workloads.WorkloadRequest` objects in
arrival order. Any trace with the ``request`` family loads (only arrival rows are used; finish
rows only complete what a capture lacks, see ``replay.workloads.read``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replay.workloads.io import write_workload as _write
from replay.workloads.model import RequestColumns, Workload, WorkloadRequest
from replay.workloads.read import read_workload

__all__ = ["Workload", "WorkloadRequest", "load_workload", "write_workload"]


def load_workload(path: str | Path, rank: int | None = None) -> Workload:
    """Read the arrival rows of the workload (or any trace) at ``path``.

    Args:
        path: trace directory with ``manifest.json`` and ``request/rank=*/part-*.parquet``.
        rank: which rank's requests (default: the lowest).
    Returns:
        :class:`Workload` sorted by (arrival_ns, seq).
    Raises:
        replay.workloads.WorkloadError (a ValueError): not a trace, no request rows, bad rows
            (checked when ``requests`` is first used: non-positive input_len, duplicate rid).
    """
    return read_workload(path, rank)


def write_workload(path: str | Path, requests: list[dict], *, hash_block_tokens: int) -> Path:
    """Write a workload from row dicts (tests and benchmarks) through the one workload writer.

    Each dict needs ``rid``, ``ts_ns``, ``input_len``, ``page_hashes``; optional ``session_id``,
    ``turn``, ``output_len``, ``max_new_tokens`` (default 16), ``rid_str``. Rows are written in
    (ts_ns, rid) order and keep their ``rid``.

    Returns:
        ``path``.
    Mutates:
        creates (or replaces) the directory ``path``.
    """
    rows = sorted(requests, key=lambda r: (r["ts_ns"], r["rid"]))
    hashes = [np.asarray([int(h) for h in r["page_hashes"]], dtype=np.uint64) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])

    def col(name, default, dtype):
        return np.array([r.get(name, default) for r in rows], dtype=dtype)

    cols = RequestColumns(
        ts_ns=col("ts_ns", 0, np.int64), session_id=col("session_id", -1, np.int64),
        turn=col("turn", -1, np.int32), input_len=col("input_len", 0, np.int32),
        output_len=col("output_len", -1, np.int32), max_new_tokens=col("max_new_tokens", 16, np.int32),
        page_hashes=np.concatenate(hashes) if hashes else np.zeros(0, np.uint64), hash_offsets=offsets,
        rid_str=[str(r.get("rid_str", "")) for r in rows], rid=col("rid", 0, np.int64))
    return _write(path, cols, hash_block_tokens, {"source": "rows"}, overwrite=True)
