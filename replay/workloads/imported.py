"""Shared last step of trace imports: parsed rows -> arrival columns with chained hashes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replay.workloads.errors import WorkloadError
from replay.workloads.hashing import chain_hashes
from replay.workloads.io import RequestColumns


@dataclass(frozen=True)
class ImportedRow:
    """One request as read from a foreign trace.

    Args:
        ts_ns: arrival, ns since the trace start.
        input_len, output_len: tokens.
        block_ids: ids of the prompt's *full* blocks, in order (a partial last block dropped).
        session_key: the source's session identity (None when unknown).
        turn: 0-based turn (-1 when unknown).
        rid_str: the source's request id ('' when none).
    """

    ts_ns: int
    input_len: int
    output_len: int
    block_ids: list[int]
    session_key: object = None
    turn: int = -1
    rid_str: str = ""


def build_columns(rows: list[ImportedRow], source: str) -> RequestColumns:
    """Sort rows by arrival (stable), number sessions densely, hash the blocks.

    A block's identity is its prefix node: (block id, everything before it), i.e. the chain of
    the raw ids. Nodes are numbered in order of first appearance and the page hashes are the
    chain of those node numbers, so the result depends only on which prompts share which
    prefixes, not on the source's id values: a relabelled copy of a trace (e.g. our own Mooncake
    export, whose ids are node numbers) imports to the very same workload.

    Args:
        rows: parsed rows, in file order.
        source: file name for the error message when there are no rows.

    Returns:
        Columns in arrival order; ``session_id`` = order of the session's first arrival.
    """
    if not rows:
        raise WorkloadError(f"{source}: no requests")
    order = sorted(range(len(rows)), key=lambda i: rows[i].ts_ns)
    rows = [rows[i] for i in order]
    sessions: dict[object, int] = {}
    session_id = np.array(
        [-1 if r.session_key is None else sessions.setdefault(r.session_key, len(sessions)) for r in rows],
        dtype=np.int64,
    )
    lengths = np.array([len(r.block_ids) for r in rows], dtype=np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    raw = np.fromiter((b for r in rows for b in r.block_ids), dtype=np.uint64, count=int(offsets[-1]))
    nodes = canonical_ids(chain_hashes(raw, lengths))
    out = np.array([r.output_len for r in rows], dtype=np.int32)
    return RequestColumns(
        ts_ns=np.array([r.ts_ns for r in rows], dtype=np.int64),
        session_id=session_id,
        turn=np.array([r.turn for r in rows], dtype=np.int32),
        input_len=np.array([r.input_len for r in rows], dtype=np.int32),
        output_len=out,
        max_new_tokens=out.copy(),
        page_hashes=chain_hashes(nodes, lengths),
        hash_offsets=offsets,
        rid_str=[r.rid_str for r in rows],
    )


def canonical_ids(ids: np.ndarray) -> np.ndarray:
    """Renumber values 0, 1, 2, ... in order of first appearance (equal stay equal)."""
    if len(ids) == 0:
        return ids.astype(np.uint64)
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.uint64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq), dtype=np.uint64)
    return rank[inverse.reshape(-1)]
