"""Read any trace's ``request`` family as a :class:`~replay.workloads.model.Workload`.

Segments are found, opened and version-checked by the one trace reader
(``replay.trace.open_trace``); this module only selects and completes the arrival rows.

Defaults for traces that lack a value (listed in ``Workload.assumed`` and, for an extracted
workload, in its manifest's ``workload.assumed``):

- ``output_len`` of an arrival row that has -1 (a capture: the server does not know it yet):
  the ``output_len`` of the request's ``finish`` row (what it generated); no finish row (aborted
  or still running at the end of the capture): stays -1, which a backend serves as
  ``max_new_tokens``. Assumed: ``"output_len<-finish"``.
- ``turn`` of rows with a session but turn -1: the 0-based position of the row among its
  session's arrivals. Assumed: ``"turn<-session order"``. Rows without a session keep -1 / -1.
- ``hash_block_tokens`` absent from the manifest (hashing was off in the capture): 16, allowed
  only when no row carries page hashes (no prefix sharing can then be replayed). Assumed:
  ``"hash_block_tokens=16"``.
- ``page_hash`` absent from the manifest: ``kvtrace-legacy`` (``tracer.schema.hashing``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.trace import TraceError, open_trace
from replay.workloads.errors import WorkloadError
from replay.workloads.model import RequestColumns, Workload
from tracer.schema import REQUEST

DEFAULT_HASH_BLOCK_TOKENS = 16


def read_workload(path: str | os.PathLike, rank: int | None = None) -> Workload:
    """Read the arrival rows of a workload or of any trace directory with the ``request`` family.

    Args:
        path: trace directory (``manifest.json`` + ``request/rank=<r>/part-*.parquet``).
        rank: which rank's requests to use; default: the lowest rank present.

    Returns:
        The workload, rows sorted by (ts_ns, seq), completed as the module docstring says.

    Raises:
        WorkloadError: not a trace, unknown schema major version, bad request segments, no
            request rows for the rank, or page hashes without ``hash_block_tokens``.
    """
    path = Path(path)
    if not path.is_dir():
        raise WorkloadError(f"{path}: not a directory (expected a workload/trace directory)")
    if _PRELOADED:
        kept = _PRELOADED.get((str(path.resolve()), rank))
        if kept is not None and kept[0] == _fingerprint(path):
            return kept[1]
    try:
        trace = open_trace(path, strict=False)
    except TraceError as e:
        raise WorkloadError(str(e)) from None
    bad = [p for p in trace.problems if _family_of(path, p.file) == "request"]
    if bad:
        raise WorkloadError("; ".join(str(p) for p in bad))
    ranks = sorted({s.rank for s in trace.segments if s.family == "request"})
    if not ranks:
        raise WorkloadError(f"{path}: no request family (expected {path / 'request'}/rank=<r>/part-*.parquet)")
    if rank is None:
        rank = ranks[0]
    elif rank not in ranks:
        raise WorkloadError(f"{path}: no requests for rank {rank} (ranks present: {ranks})")
    try:
        table = trace.table("request", rank)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
        raise WorkloadError(f"{path / 'request' / f'rank={rank}'}: unreadable request segment ({e})") from None
    table = _plain(table)
    arrivals = _arrivals_in_order(table)
    if arrivals.num_rows == 0:
        raise WorkloadError(f"{path / 'request' / f'rank={rank}'}: no request arrival rows")
    assumed: list[str] = []
    arrivals = _complete_output_len(arrivals, table, assumed)
    arrivals = _complete_turns(arrivals, assumed)
    cols = _columns(arrivals)
    block = _hash_block_tokens(path, trace.manifest, cols, assumed)
    return Workload(path, trace.manifest, block, cols, arrivals, rank, tuple(assumed))


#: (directory, rank) -> (its files' fingerprint, the workload read from it): see :func:`preload_workload`
_PRELOADED: dict[tuple[str, int | None], tuple[tuple, Workload]] = {}


def preload_workload(path: str | os.PathLike, rank: int | None = None) -> Workload:
    """:func:`read_workload`, kept: until the directory's files change, a later ``read_workload``
    of it in this process, or in a process forked from it, returns this workload (its request
    objects built) instead of reading it again. A sweep's zygote preloads its source before it
    forks the runs (``replay.runs.worker.warm``); nothing else does, so no other caller shares
    a workload object."""
    key = (str(Path(path).resolve()), rank)
    _PRELOADED.pop(key, None)
    wl = read_workload(path, rank)
    wl.requests  # noqa: B018 - a cached property: built once, before the forks
    _PRELOADED[key] = (_fingerprint(Path(path)), wl)
    return wl


def _fingerprint(path: Path) -> tuple:
    """Every file under ``path`` with its size and modification time."""
    out = []
    for p in sorted(path.rglob("*")):
        try:
            st = p.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((str(p.relative_to(path)), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _family_of(root: Path, file: str) -> str | None:
    try:
        return Path(file).relative_to(root).parts[0]
    except (ValueError, IndexError):
        return None


def _plain(table: pa.Table) -> pa.Table:
    """REQUEST columns in schema order, ``event`` as strings, without the partition column."""
    cols = []
    for name in REQUEST.column_names:
        c = table.column(name)
        if name == "event" and pa.types.is_dictionary(c.type):
            c = c.cast(pa.string())
        cols.append(c)
    return pa.table(cols, names=REQUEST.column_names)


def _arrivals_in_order(table: pa.Table) -> pa.Table:
    """The arrival rows sorted by (ts_ns, seq). A workload holds only arrivals, already in that
    order: then the table itself (a filter and a sort copy every page hash: ~0.3 s an hour)."""
    is_arrival = pc.fill_null(pc.equal(table.column("event"), "arrival"), False)
    if not pc.all(is_arrival).as_py():
        table = table.filter(is_arrival)
    if not (table.column("ts_ns").null_count or table.column("seq").null_count):
        ts = table.column("ts_ns").to_numpy().astype(np.int64, copy=False)
        seq = table.column("seq").to_numpy().astype(np.int64, copy=False)
        if bool(np.all((ts[1:] > ts[:-1]) | ((ts[1:] == ts[:-1]) & (seq[1:] > seq[:-1])))):
            return table
    return table.sort_by([("ts_ns", "ascending"), ("seq", "ascending")])


def _complete_output_len(arrivals: pa.Table, table: pa.Table, assumed: list[str]) -> pa.Table:
    out = pc.fill_null(arrivals.column("output_len"), -1).to_numpy().astype(np.int32)
    missing = out < 0
    if not missing.any():
        return arrivals
    fin = table.filter(pc.equal(table.column("event"), "finish"))
    if fin.num_rows == 0:
        return arrivals
    done = dict(zip(fin.column("rid").to_pylist(), fin.column("output_len").to_pylist()))
    rids = arrivals.column("rid").to_pylist()
    filled = out.copy()
    for i in np.flatnonzero(missing):
        v = done.get(rids[i])
        if v is not None and v >= 0:
            filled[i] = v
    if (filled != out).any():
        assumed.append("output_len<-finish")
        arrivals = arrivals.set_column(REQUEST.column_names.index("output_len"), "output_len",
                                       pa.array(filled, pa.int32()))
    return arrivals


def _complete_turns(arrivals: pa.Table, assumed: list[str]) -> pa.Table:
    turn = pc.fill_null(arrivals.column("turn"), -1).to_numpy().astype(np.int32)
    sid = pc.fill_null(arrivals.column("session_id"), -1).to_numpy().astype(np.int64)
    todo = (turn < 0) & (sid >= 0)
    if not todo.any():
        return arrivals
    # sessions whose every row lacks a turn: number their rows in arrival order
    known = set(sid[(turn >= 0) & (sid >= 0)].tolist())
    counts: dict[int, int] = {}
    new = turn.copy()
    for i in np.flatnonzero(todo):
        s = int(sid[i])
        if s in known:
            continue
        new[i] = counts.get(s, 0)
        counts[s] = new[i] + 1
    if (new != turn).any():
        assumed.append("turn<-session order")
        arrivals = arrivals.set_column(REQUEST.column_names.index("turn"), "turn", pa.array(new, pa.int32()))
    return arrivals


def _hash_block_tokens(path: Path, manifest: dict, cols: RequestColumns, assumed: list[str]) -> int:
    block = manifest.get("hash_block_tokens")
    if isinstance(block, int) and not isinstance(block, bool) and block > 0:
        return block
    if len(cols.page_hashes) == 0:
        assumed.append(f"hash_block_tokens={DEFAULT_HASH_BLOCK_TOKENS}")
        return DEFAULT_HASH_BLOCK_TOKENS
    raise WorkloadError(f"{path / 'manifest.json'}: missing or invalid hash_block_tokens ({block!r}); "
                        "expected a positive int (the rows carry page hashes)")


def _columns(table: pa.Table) -> RequestColumns:
    hashes = table.column("page_hashes").combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(hashes).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)

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
        rid_str=[s or "" for s in table.column("rid_str").to_pylist()],
        rid=col("rid", np.int64),
    )
