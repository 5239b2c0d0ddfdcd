"""Write and read workload traces: a trace directory with the ``request`` family only.

Layout (DESIGN.md §3)::

    W/manifest.json
    W/request/rank=0/part-00000.parquet     # arrival rows, REQUEST columns in schema order

Writing goes through the schema package's writers (``tracer.schema.storage.write_family_table``,
``tracer.schema.manifest.write_manifest``) into a temporary directory next to the target, renamed into
place only when complete. Reading accepts any trace directory (a full recording too) and keeps
only the ``request`` family's arrival rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracer.schema.manifest import read_manifest, write_manifest
from tracer.schema import (
    MANIFEST_FILE,
    MANIFEST_KEYS,
    REQUEST,
    SCHEMA_MAJOR,
    SCHEMA_VERSION,
    PRODUCER,
    RequestEvent,
    parse_major,
)
from tracer.schema.storage import write_family_table

from replay.workloads.errors import WorkloadError

# ------------------------------------------------------------------------------------------
# In-memory form
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestColumns:
    """Arrival rows of a workload as numpy columns (row i = i-th arrival).

    ``page_hashes`` is flat: row i owns ``page_hashes[hash_offsets[i]:hash_offsets[i+1]]``.
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

    @property
    def num_requests(self) -> int:
        return len(self.ts_ns)

    def hashes_of(self, i: int) -> np.ndarray:
        """Page hashes of row ``i``."""
        return self.page_hashes[self.hash_offsets[i] : self.hash_offsets[i + 1]]


@dataclass(frozen=True)
class Workload:
    """A workload read from disk: its manifest and arrival rows sorted by (ts_ns, seq)."""

    path: Path
    manifest: dict
    hash_block_tokens: int
    requests: RequestColumns
    table: pa.Table  # stored REQUEST columns of the arrival rows (enum columns as strings)

    @property
    def num_requests(self) -> int:
        return self.requests.num_requests


# ------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------


def _producer_version() -> str:
    try:
        from importlib.metadata import version

        return version("kvtrace")
    except Exception:  # running from a checkout that is not installed
        return "0+unknown"


def workload_manifest(hash_block_tokens: int, workload: dict) -> dict:
    """A deterministic manifest for a workload trace (no wall clock, no environment).

    Args:
        hash_block_tokens: tokens per page hash.
        workload: the ``workload`` key (shape/source, parameters, seed, ...).

    Returns:
        A dict with exactly the keys of ``tracer.schema.MANIFEST_KEYS``.
    """
    m = {
        "schema_version": SCHEMA_VERSION,
        "producer": {"name": PRODUCER, "version": _producer_version(), "source": "workload"},
        "created_unix_ns": 0,
        "clock": {"monotonic_ns": 0, "unix_ns": 0},
        "hash_block_tokens": int(hash_block_tokens),
        "server": {},
        "env": {},
        "ranks": [0],
        "options": {},
        "workload": workload,
    }
    assert list(m) == list(MANIFEST_KEYS), "manifest keys drifted from tracer.schema"
    return m


def request_table(cols: RequestColumns) -> pa.Table:
    """The REQUEST-family table (raw form: enum as strings) of arrival rows.

    Args:
        cols: arrival rows in arrival order; ``rid`` becomes 0..N-1 and ``seq`` 1..N.

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
    hashes = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(np.asarray(cols.page_hashes, dtype=np.uint64))
    )
    data = {
        "ts_ns": pa.array(ts, pa.int64()),
        "seq": pa.array(np.arange(1, n + 1, dtype=np.int64)),
        "event": pa.array(["arrival"] * n, pa.string()),
        "rid": pa.array(np.arange(n, dtype=np.int64)),
        "session_id": pa.array(np.asarray(cols.session_id, dtype=np.int64)),
        "turn": pa.array(np.asarray(cols.turn, dtype=np.int32)),
        "input_len": pa.array(np.asarray(cols.input_len, dtype=np.int32)),
        "output_len": pa.array(np.asarray(cols.output_len, dtype=np.int32)),
        "max_new_tokens": pa.array(np.asarray(cols.max_new_tokens, dtype=np.int32)),
        "cached_len": pa.array(np.full(n, -1, dtype=np.int32)),
        "rid_str": pa.array(cols.rid_str if cols.rid_str is not None else [""] * n, pa.string()),
        "page_hashes": hashes,
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
    target = Path(target)
    if target.exists() and not overwrite and (not target.is_dir() or any(target.iterdir())):
        raise WorkloadError(f"{target} already exists (use --force to replace it)")
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
) -> Path:
    """Write a workload trace atomically.

    Args:
        out: target directory.
        cols: arrival rows in arrival order.
        hash_block_tokens: tokens per page hash (recorded in the manifest).
        workload: manifest ``workload`` key.
        overwrite: replace an existing directory.

    Returns:
        The target path.
    """
    table = request_table(cols)
    manifest = workload_manifest(hash_block_tokens, workload)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        _write(tmp, table, manifest)
    return Path(out)


def _write(trace_dir: Path, table: pa.Table, manifest: dict) -> None:
    """The one place that touches the on-disk format (tracer writers)."""
    write_family_table(trace_dir, "request", table, rank=0, part=0)
    write_manifest(trace_dir, manifest)


# ------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------


def read_workload(path: str | os.PathLike, rank: int | None = None) -> Workload:
    """Read the arrival rows of a workload or of any trace directory.

    Args:
        path: trace directory (``manifest.json`` + ``request/rank=<r>/part-*.parquet``).
        rank: which rank's requests to use; default: the lowest rank present.

    Returns:
        The workload, rows sorted by (ts_ns, seq).

    Raises:
        WorkloadError: not a trace, unknown schema major version, no request rows, or no
            ``hash_block_tokens`` in the manifest.
    """
    path = Path(path)
    if not path.is_dir():
        raise WorkloadError(f"{path}: not a directory (expected a workload/trace directory)")
    try:
        manifest = read_manifest(path)
    except (FileNotFoundError, ValueError) as e:
        raise WorkloadError(str(e)) from None
    version = manifest.get("schema_version")
    try:
        major = parse_major(version)
    except ValueError as e:
        raise WorkloadError(f"{path / MANIFEST_FILE}: {e}") from None
    if major != SCHEMA_MAJOR:
        raise WorkloadError(
            f"{path / MANIFEST_FILE}: schema_version {version} is not supported "
            f"(this kvtrace reads major version {SCHEMA_MAJOR})"
        )
    parts = _request_parts(path, rank)
    table = pa.concat_tables([_read_part(p) for p in parts], promote_options="default")
    table = _arrivals(table)
    if table.num_rows == 0:
        raise WorkloadError(f"{path}: no request arrival rows")
    table = table.sort_by([("ts_ns", "ascending"), ("seq", "ascending")])
    block = manifest.get("hash_block_tokens")
    if not isinstance(block, int) or block <= 0:
        raise WorkloadError(f"{path / MANIFEST_FILE}: missing or invalid hash_block_tokens ({block!r})")
    return Workload(path, manifest, block, _columns(table), table)


def _request_parts(path: Path, rank: int | None) -> list[Path]:
    fam = path / "request"
    ranks = sorted(
        int(d.name.split("=", 1)[1])
        for d in (fam.iterdir() if fam.is_dir() else [])
        if d.is_dir() and d.name.startswith("rank=") and d.name.split("=", 1)[1].isdigit()
    )
    if not ranks:
        raise WorkloadError(f"{path}: no request family (expected {fam}/rank=<r>/part-*.parquet)")
    if rank is None:
        rank = ranks[0]
    elif rank not in ranks:
        raise WorkloadError(f"{path}: no requests for rank {rank} (ranks present: {ranks})")
    parts = sorted((fam / f"rank={rank}").glob("part-*.parquet"))
    if not parts:
        raise WorkloadError(f"{fam / f'rank={rank}'}: no closed segments (part-*.parquet)")
    return parts


def _read_part(p: Path) -> pa.Table:
    try:
        t = pq.read_table(p)
    except (pa.ArrowInvalid, OSError) as e:
        raise WorkloadError(f"{p}: unreadable Parquet ({e})") from None
    meta = t.schema.metadata or {}
    ver = meta.get(b"kvtrace.schema_version")
    if ver is not None and parse_major(ver.decode()) != SCHEMA_MAJOR:
        raise WorkloadError(
            f"{p}: schema_version {ver.decode()} is not supported (reads major {SCHEMA_MAJOR})"
        )
    missing = [c for c in REQUEST.column_names if c not in t.column_names]
    if missing:
        raise WorkloadError(f"{p}: missing request columns {missing}")
    cols = []
    for name in REQUEST.column_names:
        c = t.column(name)
        if name == "event":
            c = _event_names(c)
        cols.append(c)
    return pa.table(cols, names=REQUEST.column_names)


def _event_names(c: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(c.type):
        return c.cast(pa.string())
    if pa.types.is_integer(c.type):  # raw codes
        names = np.array([e.name.lower() for e in sorted(RequestEvent, key=int)], dtype=object)
        return pa.chunked_array([pa.array(names[c.to_numpy()].tolist(), pa.string())])
    return c


def _arrivals(table: pa.Table) -> pa.Table:
    return table.filter(pc.equal(table.column("event"), "arrival"))


def _columns(table: pa.Table) -> RequestColumns:
    hashes = table.column("page_hashes").combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(hashes).to_numpy(zero_copy_only=False).astype(np.uint64)

    def col(name, dtype):
        return pc.fill_null(table.column(name), -1).to_numpy().astype(dtype)

    return RequestColumns(
        ts_ns=col("ts_ns", np.int64),
        session_id=col("session_id", np.int64),
        turn=col("turn", np.int32),
        input_len=col("input_len", np.int32),
        output_len=col("output_len", np.int32),
        max_new_tokens=col("max_new_tokens", np.int32),
        page_hashes=flat,
        hash_offsets=offsets,
        rid_str=table.column("rid_str").to_pylist(),
    )
