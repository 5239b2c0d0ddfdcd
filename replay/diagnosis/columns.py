"""Column loading shared by ``verify`` and ``doctor``: a trace rank's ``pool``, ``stats`` and
``drops`` families as numpy arrays sorted by ``seq`` (enums as integer codes of
``tracer.schema``), read once with pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.errors import KvtraceError
from tracer.schema import CacheOp, Pool, PoolOp, RequestEvent

POOL_NAMES = {int(p): p.name.lower() for p in Pool}
ALLOC, FREE = int(PoolOp.ALLOC), int(PoolOp.FREE)


class DiagnosisError(KvtraceError):
    """A trace that cannot be verified or diagnosed; the message names file and expectation."""


def codes(col: pa.ChunkedArray | pa.Array, enum_type) -> np.ndarray:
    """Integer codes of a stored enum column (dictionary strings or raw codes)."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks != 1:  # segments may carry different dictionaries: convert each
            parts = [codes(c, enum_type) for c in col.chunks]
            return np.concatenate(parts) if parts else np.zeros(0, np.int16)
        col = col.chunk(0)
    if pa.types.is_dictionary(col.type):
        names = col.dictionary.to_pylist()
        lut = np.array([_code(enum_type, n) for n in names] or [0], dtype=np.int16)
        idx = col.indices.to_numpy(zero_copy_only=False)
        return lut[idx] if len(idx) else np.zeros(0, np.int16)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return np.array([_code(enum_type, n) for n in col.to_pylist()], dtype=np.int16)
    return col.to_numpy(zero_copy_only=False).astype(np.int16)


def _code(enum_type, name) -> int:
    try:
        return int(enum_type[str(name).upper()])
    except KeyError:
        return -1  # unknown member (a newer minor version): never matches a known op


def num(table: pa.Table, name: str, dtype=np.int64) -> np.ndarray:
    return table.column(name).to_numpy().astype(dtype, copy=False)


@dataclass
class PoolOps:
    """Allocator rows in seq order."""

    seq: np.ndarray
    ts_ns: np.ndarray
    pool: np.ndarray
    op: np.ndarray
    rid: np.ndarray
    num_slots: np.ndarray
    page_ids: pa.ListArray | None  # None when the trace has no page ids


@dataclass
class Stats:
    seq: np.ndarray
    ts_ns: np.ndarray
    forward_ct: np.ndarray
    pool: np.ndarray
    capacity: np.ndarray
    available: np.ndarray
    evictable: np.ndarray
    protected: np.ndarray
    held: np.ndarray

    def take(self, idx) -> "Stats":
        return Stats(**{k: v[idx] for k, v in self.__dict__.items()})


def load_pool(tr, rank: int, *, pages: bool) -> PoolOps:
    cols = ["seq", "ts_ns", "pool", "op", "rid", "num_slots"] + (["page_ids"] if pages else [])
    t = _read(tr, "pool", rank, cols)
    order = np.argsort(num(t, "seq"), kind="stable")
    if not np.all(order == np.arange(len(order))):
        t = t.take(pa.array(order))
    ids = None
    if pages:
        col = t.column("page_ids")
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        ids = col if col.null_count < len(col) else None
    return PoolOps(num(t, "seq"), num(t, "ts_ns"), codes(t.column("pool"), Pool),
                   codes(t.column("op"), PoolOp), num(t, "rid"), num(t, "num_slots"), ids)


def load_stats(tr, rank: int) -> Stats:
    if tr.rows("stats") == 0:
        raise DiagnosisError(f"{tr.path}: no `stats` rows; expected a trace recorded with pool "
                             "sampling on (the stats family holds capacity/available/evictable/"
                             "protected/held per pool)")
    t = _read(tr, "stats", rank, ["seq", "ts_ns", "forward_ct", "pool", "capacity", "available",
                                    "evictable", "protected", "held"])
    t = t.take(pa.array(np.argsort(num(t, "seq"), kind="stable")))
    return Stats(num(t, "seq"), num(t, "ts_ns"), num(t, "forward_ct"), codes(t.column("pool"), Pool),
                 *(num(t, c) for c in ("capacity", "available", "evictable", "protected", "held")))


def load_drops(tr, rank: int) -> list[dict]:
    t = _read(tr, "drops", rank, ["seq", "ts_ns", "family", "first_seq", "last_seq", "num_events",
                                   "reason", "detail"])
    rows = t.to_pylist()
    return sorted(rows, key=lambda r: r["seq"])


def load_cache(tr, rank: int) -> dict[str, np.ndarray]:
    t = _read(tr, "cache", rank, ["seq", "ts_ns", "op", "rid", "device_hit", "full_tokens",
                                   "swa_tokens"])
    order = np.argsort(num(t, "seq"), kind="stable")
    out = {c: num(t, c)[order] for c in ("seq", "ts_ns", "rid", "device_hit", "full_tokens",
                                         "swa_tokens")}
    out["op"] = codes(t.column("op"), CacheOp)[order]
    return out


def load_requests(tr, rank: int) -> dict[str, np.ndarray]:
    t = _read(tr, "request", rank, ["seq", "ts_ns", "event", "rid", "input_len", "output_len"])
    order = np.argsort(num(t, "seq"), kind="stable")
    out = {c: num(t, c)[order] for c in ("seq", "ts_ns", "rid", "input_len", "output_len")}
    out["event"] = codes(t.column("event"), RequestEvent)[order]
    return out


def _read(tr, family: str, rank: int, columns: list[str]) -> pa.Table:
    """Only ``columns`` of the family's segments of ``rank`` (page ids are read only when asked)."""
    import pyarrow.parquet as pq

    segs = [s for s in tr.segments if s.family == family and s.rank == rank]
    if not segs:
        return tr.table(family, rank).select(columns)
    parts = []
    for s in segs:
        names = pq.ParquetFile(s.path).schema_arrow.names
        missing = [c for c in columns if c not in names]
        if missing:
            raise DiagnosisError(f"{s.path}: missing columns {missing}; expected schema-v1 "
                                 f"{family} columns")
        parts.append(pq.read_table(s.path, columns=columns))
    return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]


def list_offsets(ids: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, flat values) of a list column; null lists count as empty."""
    lens = pc.fill_null(pc.list_value_length(ids), 0).to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets, flat
