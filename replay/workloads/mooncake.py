"""Mooncake trace format (kvcache-ai/Mooncake, FAST'25 ``traces/*.jsonl``): import and export.

One JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

``timestamp`` is the arrival in ms since the trace start; ``hash_ids`` name the prompt's
512-token blocks (the last, partial block has an id too), equal ids at equal positions meaning
equal prefixes. An optional ``session_id`` (string or int, as some tools emit) is kept as the
session, with turns numbered in arrival order.

Import hashes the *full* 512-token blocks (``hash_block_tokens`` = 512): a block is identified
by its id and everything before it, numbered in order of first appearance, then chained
(``imported.build_columns``), so hashes do not depend on the file's id values. Export maps page hashes back to small integer ids in first-seen order, one per full
512-token block, plus a fresh id for a partial last block, so import -> export -> import
reproduces the same workload.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tqdm import tqdm

from replay.workloads.errors import WorkloadError
from replay.workloads.imported import ImportedRow, build_columns
from replay.workloads.io import read_workload, write_workload
from replay.workloads.jsonl import file_sha256, read_lines

MOONCAKE_BLOCK_TOKENS = 512


def read_mooncake(path: str | os.PathLike, progress: bool = False) -> list[ImportedRow]:
    """Parse and validate a Mooncake JSONL file.

    Args:
        path: the file.
        progress: show a progress bar.

    Returns:
        Rows in file order.

    Raises:
        FormatError: a malformed line (file, line number and field in the message).
    """
    rows = []
    for line in read_lines(path, progress):
        ts_ns = line.scaled("timestamp", 1_000_000)
        input_len = line.int("input_length", minimum=1)
        output_len = line.int("output_length")
        ids = line.block_ids("hash_ids", input_len, MOONCAKE_BLOCK_TOKENS)
        session = line.str_or_int("session_id", default=None) if "session_id" in line.obj else None
        rows.append(
            ImportedRow(
                ts_ns=ts_ns,
                input_len=input_len,
                output_len=output_len,
                block_ids=ids[: input_len // MOONCAKE_BLOCK_TOKENS],
                session_key=None if session is None else ("s", session),
                turn=-1,
            )
        )
    return _number_turns(rows)


def _number_turns(rows: list[ImportedRow]) -> list[ImportedRow]:
    """Turns of rows with a session: 0, 1, ... in (stable) arrival order."""
    if all(r.session_key is None for r in rows):
        return rows
    order = sorted(range(len(rows)), key=lambda i: rows[i].ts_ns)
    seen: dict[object, int] = {}
    out = list(rows)
    for i in order:
        r = rows[i]
        if r.session_key is not None:
            k = seen.get(r.session_key, 0)
            seen[r.session_key] = k + 1
            out[i] = ImportedRow(r.ts_ns, r.input_len, r.output_len, r.block_ids, r.session_key, k, r.rid_str)
    return out


def import_mooncake(
    path: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False, progress: bool = False
) -> Path:
    """Import a Mooncake JSONL trace as a workload (nothing is written if a line is malformed).

    Args:
        path: Mooncake JSONL file.
        out: target workload directory.
        overwrite: replace an existing directory.
        progress: show progress bars.

    Returns:
        The written directory.
    """
    rows = read_mooncake(path, progress)
    cols = build_columns(rows, str(path))
    workload = {
        "source": "mooncake",
        "file": Path(path).name,
        "sha256": file_sha256(path),
        "source_block_tokens": MOONCAKE_BLOCK_TOKENS,
        "num_requests": cols.num_requests,
    }
    return write_workload(out, cols, MOONCAKE_BLOCK_TOKENS, workload, overwrite=overwrite)


def export_mooncake(
    workload_dir: str | os.PathLike,
    out: str | os.PathLike,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    with_sessions: bool = False,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Write a workload (or any trace's requests) as Mooncake JSONL.

    Args:
        workload_dir: workload or trace directory.
        out: JSONL file to write (atomically).
        block_tokens: tokens per exported block id; a multiple of the workload's
            ``hash_block_tokens`` (default 512, Mooncake's).
        with_sessions: also write ``session_id`` (and nothing else) for rows whose session is
            known; off by default because some replayers treat ``session_id`` as closed-loop
            multi-turn.
        overwrite: replace an existing file.
        progress: show a progress bar.

    Returns:
        The written file.
    """
    w = read_workload(workload_dir)
    hb = w.hash_block_tokens
    if block_tokens < hb or block_tokens % hb:
        raise WorkloadError(
            f"cannot export {block_tokens}-token blocks from {workload_dir}: its hash_block_tokens "
            f"is {hb} (the block size must be a multiple of it)"
        )
    out = Path(out)
    if out.exists() and not overwrite:
        raise WorkloadError(f"{out} already exists (use --force to replace it)")
    group = block_tokens // hb
    c = w.columns
    ids = _IdMap()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            for i in tqdm(range(c.num_requests), desc="export", unit="req", disable=not progress, leave=False):
                input_len = int(c.input_len[i])
                ends = c.hashes_of(i)[group - 1 :: group][: input_len // block_tokens].tolist()
                row_ids = [ids.of(h) for h in ends]
                # the partial last block (and any block the source did not hash) is never shared
                row_ids += [ids.fresh() for _ in range(-(-input_len // block_tokens) - len(row_ids))]
                rec = {
                    "timestamp": int(c.ts_ns[i]) // 1_000_000,
                    "input_length": input_len,
                    "output_length": int(max(c.output_len[i], 0)),
                    "hash_ids": row_ids,
                }
                if with_sessions and c.session_id[i] >= 0:
                    rec["session_id"] = int(c.session_id[i])
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


class _IdMap:
    """Small integer ids for page hashes, in first-seen order (Mooncake's convention)."""

    def __init__(self):
        self._ids: dict[int, int] = {}
        self._next = 0

    def of(self, page_hash: int) -> int:
        i = self._ids.get(page_hash)
        if i is None:
            i = self._ids[page_hash] = self.fresh()
        return i

    def fresh(self) -> int:
        self._next += 1
        return self._next - 1
