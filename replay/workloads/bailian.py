"""Qwen-Bailian trace format (alibaba-edu/qwen-bailian-usagetraces-anon): import.

One JSON object per line::

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

``timestamp`` is seconds since the trace start; ``hash_ids`` name the prompt's 16-token blocks
(salted SipHash remapped to integers); ``parent_chat_id`` links a turn to the previous one
(-1 for a root) and ``turn`` counts from 1. Import keeps:
- session: the root of the ``parent_chat_id`` chain (a parent missing from the file starts
  its own session), numbered densely in order of first arrival;
- turn: ``turn - 1`` (0-based), or the depth in the chain when ``turn`` is absent;
- rid_str: the ``chat_id``; page hashes: one per full 16-token block (``hash_block_tokens`` =
  16), equal exactly where the ids and everything before them are (``imported.build_columns``). The request ``type`` is counted in the manifest only.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from replay.workloads.errors import FormatError
from replay.workloads.imported import ImportedRow, build_columns
from replay.workloads.io import write_workload
from replay.workloads.jsonl import file_sha256, read_lines

BAILIAN_BLOCK_TOKENS = 16


def read_bailian(path: str | os.PathLike, progress: bool = False) -> tuple[list[ImportedRow], Counter]:
    """Parse and validate a Bailian JSONL file.

    Args:
        path: the file.
        progress: show a progress bar.

    Returns:
        (rows in file order, count of requests per ``type``).

    Raises:
        FormatError: a malformed line, a duplicate ``chat_id`` or a ``parent_chat_id`` cycle.
    """
    parsed = []
    first_line: dict[int, int] = {}
    types: Counter = Counter()
    for line in read_lines(path, progress):
        chat = line.int("chat_id", minimum=None, maximum=2**63 - 1)
        if chat in first_line:
            raise line.fail("chat_id", f"duplicate id {chat} (first on line {first_line[chat]})")
        first_line[chat] = line.number
        parent = line.int("parent_chat_id", minimum=-1, default=-1, maximum=2**63 - 1)
        if parent == chat:
            raise line.fail("parent_chat_id", f"chat {chat} is its own parent")
        ts_ns = line.scaled("timestamp", 1_000_000_000)
        input_len = line.int("input_length", minimum=1)
        output_len = line.int("output_length")
        turn = line.int("turn", minimum=1, default=None) if "turn" in line.obj else None
        types[line.str("type", default="")] += 1
        ids = line.block_ids("hash_ids", input_len, BAILIAN_BLOCK_TOKENS)
        parsed.append((line.number, chat, parent, ts_ns, input_len, output_len, turn, ids))

    parent_of = {chat: parent for _, chat, parent, *_ in parsed}
    roots: dict[int, tuple[int, int]] = {}  # chat -> (root, depth)

    def root(chat: int, lineno: int) -> tuple[int, int]:
        chain = []
        c = chat
        while c not in roots:
            p = parent_of.get(c, -1)
            if p == -1 or p not in parent_of:
                roots[c] = (c if p == -1 else p, 0 if p == -1 else 1)
                break
            if c in chain:
                raise FormatError(str(path), lineno, "parent_chat_id", f"cycle through chat {c}")
            chain.append(c)
            c = p
        r, d = roots[c]
        for c2 in reversed(chain):
            d += 1
            roots[c2] = (r, d)
        return roots[chat]

    rows = []
    for lineno, chat, parent, ts_ns, input_len, output_len, turn, ids in parsed:
        r, depth = root(chat, lineno)
        rows.append(
            ImportedRow(
                ts_ns=ts_ns,
                input_len=input_len,
                output_len=output_len,
                block_ids=ids[: input_len // BAILIAN_BLOCK_TOKENS],
                session_key=r,
                turn=(turn - 1) if turn is not None else depth,
                rid_str=str(chat),
            )
        )
    return rows, types


def import_bailian(
    path: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False, progress: bool = False
) -> Path:
    """Import a Bailian JSONL trace as a workload (nothing is written if a line is malformed).

    Args:
        path: Bailian JSONL file.
        out: target workload directory.
        overwrite: replace an existing directory.
        progress: show progress bars.

    Returns:
        The written directory.
    """
    rows, types = read_bailian(path, progress)
    cols = build_columns(rows, str(path))
    workload = {
        "source": "bailian",
        "file": Path(path).name,
        "sha256": file_sha256(path),
        "source_block_tokens": BAILIAN_BLOCK_TOKENS,
        "num_requests": cols.num_requests,
        "request_types": dict(sorted(types.items())),
    }
    return write_workload(out, cols, BAILIAN_BLOCK_TOKENS, workload, overwrite=overwrite)
