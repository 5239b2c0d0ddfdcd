"""Write and read workload traces: a trace directory with the ``request`` family only.

Layout (DESIGN.md §3)::

    W/manifest.json
    W/request/rank=0/part-00000.parquet     # arrival rows, REQUEST columns in schema order

Writing (the one workload writer) goes through the schema package's writers
(``tracer.schema.storage.write_family_table``, ``tracer.schema.manifest.write_manifest``) into a
temporary directory next to the target, renamed into place only when complete. Reading accepts
any trace directory with the ``request`` family (a workload, a ``kvtrace record`` trace, a
capture from a server) through the one trace reader, ``replay.trace.open_trace``, and keeps the
arrival rows of one rank (see :func:`read_workload` for the defaults a capture gets).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracer.schema.hashing import PAGE_HASH_NAME
from tracer.schema.manifest import write_manifest
from tracer.schema.prefixes import encode_chains
from tracer.schema import MANIFEST_KEYS, REQUEST, SCHEMA_VERSION, PRODUCER
from tracer.schema.storage import write_family_table

from replay.workloads.errors import WorkloadError
from replay.workloads.model import RequestColumns, Workload, WorkloadRequest
from replay.workloads.read import DEFAULT_HASH_BLOCK_TOKENS, read_workload

__all__ = ["RequestColumns", "Workload", "WorkloadRequest", "DEFAULT_HASH_BLOCK_TOKENS", "atomic_dir",
           "read_workload", "request_table", "workload_manifest", "write_workload"]

# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------


def _producer_version() -> str:
    try:
        from importlib.metadata import version

        return version("kvtrace")
    except Exception:  # running from a checkout that is not installed
        return "0+unknown"


def workload_manifest(hash_block_tokens: int, workload: dict, *, page_hash: str = PAGE_HASH_NAME,
                      server: dict | None = None) -> dict:
    """A deterministic manifest for a workload trace (no wall clock, no environment).

    Args:
        hash_block_tokens: tokens per page hash.
        workload: the ``workload`` key (shape/source, parameters, seed, ...).
        page_hash: name of the function that made the page hashes (an extracted workload keeps
            its source trace's).
        server: server config to keep (an extracted workload keeps its source trace's).

    Returns:
        A dict with exactly the keys of ``tracer.schema.MANIFEST_KEYS``.
    """
    m = {
        "schema_version": SCHEMA_VERSION,
        "producer": {"name": PRODUCER, "version": _producer_version(), "source": "workload"},
        "created_unix_ns": 0,
        "clock": {"monotonic_ns": 0, "unix_ns": 0},
        "hash_block_tokens": int(hash_block_tokens),
        "page_hash": page_hash,
        "server": dict(server or {}),
        "env": {},
        "ranks": [0],
        "options": {},
        "workload": workload,
        "chain_storage": "hashes",
    }
    assert list(m) == list(MANIFEST_KEYS), "manifest keys drifted from tracer.schema"
    return m


def request_table(cols: RequestColumns) -> pa.Table:
    """The REQUEST-family table (raw form: enum as strings) of arrival rows, in the storage form
    of schema 1.1: each row's longest prefix shared with an earlier row is a reference
    (``prefix_rid``, ``prefix_blocks``) and ``page_hashes`` holds the rest (``encode_chains``;
    ``replay.trace`` expands it back).

    Args:
        cols: arrival rows in arrival order; ``rid`` is ``cols.rid`` (default 0..N-1), ``seq`` 1..N.

    Returns:
        A table with the REQUEST columns in schema order.
    """
    n = cols.num_requests
    ts = np.asarray(cols.ts_ns, dtype=np.int64)
    if n and np.any(np.diff(ts) < 0):
        raise WorkloadError("arrival times must be non-decreasing")
    offsets = np.asarray(cols.hash_offsets, dtype=np.int64)
    if len(offsets) != n + 1 or offsets[-1] != len(cols.page_hashes):
        raise WorkloadError("hash_offsets do not match page_hashes")
    if offsets[-1] >= 2**31:
        raise WorkloadError("too many page hashes for one segment (>= 2**31)")
    prefix_rid, prefix_blocks, flat, offsets = encode_chains(cols.rids(), cols.page_hashes, offsets)
    hashes = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat, pa.uint64()))
    data = {
        "ts_ns": pa.array(ts, pa.int64()),
        "seq": pa.array(np.arange(1, n + 1, dtype=np.int64)),
        "event": pa.array(["arrival"] * n, pa.string()),
        "rid": pa.array(cols.rids()),
        "session_id": pa.array(np.asarray(cols.session_id, dtype=np.int64)),
        "turn": pa.array(np.asarray(cols.turn, dtype=np.int32)),
        "input_len": pa.array(np.asarray(cols.input_len, dtype=np.int32)),
        "output_len": pa.array(np.asarray(cols.output_len, dtype=np.int32)),
        "max_new_tokens": pa.array(np.asarray(cols.max_new_tokens, dtype=np.int32)),
        "cached_len": pa.array(np.full(n, -1, dtype=np.int32)),
        "rid_str": pa.array(cols.rid_str if cols.rid_str is not None else [""] * n, pa.string()),
        "page_hashes": hashes,
        "prefix_rid": pa.array(prefix_rid, pa.int64()),
        "prefix_blocks": pa.array(prefix_blocks, pa.int32()),
        "new_blocks": pa.array(np.full(n, -1, dtype=np.int32)),  # hashes stored (1.2: not compacted)
        "tip_hash": pa.array(np.zeros(n, dtype=np.uint64)),
    }
    assert list(data) == REQUEST.column_names
    return pa.table(data)


@contextmanager
def atomic_dir(target: str | os.PathLike, overwrite: bool = False):
    """Build a directory next to ``target`` and rename it into place on success.

    Args:
        target: final directory path.
        overwrite: replace an existing ``target``; otherwise an existing non-empty one is an
            error (raised before anything is built).

    Yields:
        The temporary directory to fill. On an exception it is removed and ``target`` is left
        untouched.
    """
    from replay.outdir import check_new_dir

    target = Path(target)
    check_new_dir(target, "--out", overwrite, error=WorkloadError)  # --force replaces only kvtrace dirs
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_workload(
    out: str | os.PathLike,
    cols: RequestColumns,
    hash_block_tokens: int,
    workload: dict,
    overwrite: bool = False,
    *,
    page_hash: str = PAGE_HASH_NAME,
    server: dict | None = None,
) -> Path:
    """Write a workload trace atomically (the one workload writer).

    Args:
        out: target directory.
        cols: arrival rows in arrival order.
        hash_block_tokens: tokens per page hash (recorded in the manifest).
        workload: manifest ``workload`` key.
        overwrite: replace an existing directory.
        page_hash, server: manifest keys (see :func:`workload_manifest`).

    Returns:
        The target path.
    """
    table = request_table(cols)
    manifest = workload_manifest(hash_block_tokens, workload, page_hash=page_hash, server=server)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        _write(tmp, table, manifest)
    return Path(out)


def _write(trace_dir: Path, table: pa.Table, manifest: dict) -> None:
    """The one place that touches the on-disk format (tracer writers)."""
    write_family_table(trace_dir, "request", table, rank=0, part=0)
    write_manifest(trace_dir, manifest)


