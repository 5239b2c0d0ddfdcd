"""Workload input of the real-code backend: the arrival rows of a ``request``-only trace.

A workload is a trace directory holding only the ``request`` family (``tracer.schema.REQUEST``);
``manifest.json`` gives ``hash_block_tokens``. Only arrival rows are used; finish rows, if any,
are ignored (the backend decides when requests finish).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from tracer.schema import MANIFEST_FILE, RequestEvent

_COLUMNS = ("ts_ns", "seq", "event", "rid", "session_id", "turn", "input_len", "output_len",
            "max_new_tokens", "rid_str", "page_hashes")


@dataclass(frozen=True)
class WorkloadRequest:
    """One arriving request.

    Attributes:
        rid: request number (unique in the workload).
        arrival_ns: arrival time on the workload clock.
        session_id, turn: conversation position (-1 when unknown).
        input_len: prompt tokens.
        output_len: tokens to generate (planned; ``max_new_tokens`` when the workload has -1).
        max_new_tokens: generation cap the scheduler budgets with.
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
    """Arrivals in arrival order plus the hash block size of ``page_hashes``."""

    path: str
    hash_block_tokens: int
    requests: tuple[WorkloadRequest, ...]

    @property
    def max_seq_tokens(self) -> int:
        return max((r.input_len + r.max_new_tokens for r in self.requests), default=0)


def _event_is_arrival(col) -> np.ndarray:
    values = col.to_pylist()
    arrival = RequestEvent.ARRIVAL
    return np.array([v == int(arrival) or v == arrival.name.lower() for v in values], dtype=bool)


def load_workload(path: str | Path) -> Workload:
    """Read the arrival rows of the workload trace at ``path``.

    Args:
        path: trace directory with ``manifest.json`` and ``request/rank=*/part-*.parquet``.
    Returns:
        :class:`Workload` sorted by (arrival_ns, seq).
    Raises:
        FileNotFoundError: no manifest or no request files.
        ValueError: bad rows (non-positive input_len, duplicate rid, missing hash block size).
    """
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path} is not a trace directory (no {MANIFEST_FILE})")
    manifest = json.loads(manifest_path.read_text())
    block = manifest.get("hash_block_tokens")
    if not block or int(block) <= 0:
        raise ValueError(f"{manifest_path}: hash_block_tokens missing or not positive")
    files = sorted((path / "request").glob("rank=*/part-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{path}: no request/rank=*/part-*.parquet files")
    table = ds.dataset([str(f) for f in files], format="parquet").to_table()
    missing = [c for c in ("ts_ns", "event", "rid", "input_len", "page_hashes") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: request family lacks columns {missing}")
    table = table.filter(_event_is_arrival(table.column("event")))
    cols = {c: (table.column(c).to_pylist() if c in table.column_names else None) for c in _COLUMNS}

    def get(name: str, i: int, default):
        col = cols[name]
        return default if col is None or col[i] is None else col[i]

    keyed = []
    for i in range(table.num_rows):
        rid = int(get("rid", i, i))
        input_len = int(get("input_len", i, 0))
        if input_len <= 0:
            raise ValueError(f"{path}: rid {rid} has input_len {input_len}")
        max_new = int(get("max_new_tokens", i, 0))
        out = int(get("output_len", i, -1))
        if max_new <= 0:
            max_new = max(out, 1)
        out = max_new if out < 0 else max(1, min(out, max_new))
        req = WorkloadRequest(
            rid=rid, arrival_ns=int(get("ts_ns", i, 0)), session_id=int(get("session_id", i, -1)),
            turn=int(get("turn", i, -1)), input_len=input_len, output_len=out, max_new_tokens=max_new,
            page_hashes=np.asarray(get("page_hashes", i, []), dtype=np.uint64),
            rid_str=str(get("rid_str", i, "")),
        )
        keyed.append(((req.arrival_ns, int(get("seq", i, 0)), rid), req))
    keyed.sort(key=lambda kv: kv[0])
    rids = [r.rid for _, r in keyed]
    if len(set(rids)) != len(rids):
        raise ValueError(f"{path}: duplicate arrival rows for one rid")
    return Workload(path=str(path), hash_block_tokens=int(block), requests=tuple(r for _, r in keyed))


def write_workload(path: str | Path, requests: list[dict], *, hash_block_tokens: int) -> Path:
    """Write a minimal workload trace (manifest + one request segment of arrival rows).

    For tests and benchmarks that need a workload before sample data exists. Each dict needs
    ``rid``, ``ts_ns``, ``input_len``, ``page_hashes``; optional ``session_id``, ``turn``,
    ``output_len``, ``max_new_tokens``, ``rid_str``.

    Returns:
        ``path``.
    Mutates:
        creates ``path/manifest.json`` and ``path/request/rank=0/part-00000.parquet``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracer.schema import PRODUCER, REQUEST, SCHEMA_VERSION

    path = Path(path)
    seg = path / "request" / "rank=0"
    seg.mkdir(parents=True, exist_ok=True)
    cols: dict[str, list] = {c: [] for c in REQUEST.column_names}
    for seq, r in enumerate(sorted(requests, key=lambda r: (r["ts_ns"], r["rid"]))):
        row = {"ts_ns": r["ts_ns"], "seq": seq, "event": int(RequestEvent.ARRIVAL), "rid": r["rid"],
               "session_id": r.get("session_id", -1), "turn": r.get("turn", -1), "input_len": r["input_len"],
               "output_len": r.get("output_len", -1), "max_new_tokens": r.get("max_new_tokens", 16),
               "cached_len": -1, "rid_str": r.get("rid_str", ""),
               "page_hashes": [int(h) for h in r["page_hashes"]]}
        for c in cols:
            cols[c].append(row[c])
    schema = REQUEST.arrow_schema(stored=False)
    table = pa.table({c: pa.array(v, type=schema.field(c).type) for c, v in cols.items()}, schema=schema)
    pq.write_table(table, seg / "part-00000.parquet")
    manifest = {"schema_version": SCHEMA_VERSION, "producer": {"name": PRODUCER, "source": "workload"},
                "hash_block_tokens": hash_block_tokens, "ranks": [0], "server": {}}
    (path / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    return path
