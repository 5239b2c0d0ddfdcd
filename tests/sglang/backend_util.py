"""Shared helpers of the real-code backend tests (tests/sglang/test_backend_*.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from replay.backends.sglang import load_workload, write_workload

BLOCK = 16  # hash_block_tokens of every test workload


def blocks(tag, n: int) -> list[int]:
    """``n`` page hashes unique to ``tag`` (stable across processes)."""
    out = []
    for i in range(n):
        d = hashlib.blake2b(repr((tag, i)).encode(), digest_size=8).digest()
        out.append(int.from_bytes(d, "little") >> 1 | 1)
    return out


def req(rid: int, ts_ms: float, hashes: list[int], *, out: int = 4, max_new: int | None = None,
        session: int = -1, turn: int = -1, input_len: int | None = None) -> dict:
    """One arrival row: prompt = the hashed blocks (``input_len`` defaults to all of them)."""
    return dict(rid=rid, ts_ns=int(ts_ms * 1e6), page_hashes=hashes,
                input_len=len(hashes) * BLOCK if input_len is None else input_len,
                output_len=out, max_new_tokens=max_new or out, session_id=session, turn=turn)


def workload(tmp_path: Path, rows: list[dict], name: str = "w"):
    """Write ``rows`` as a workload under ``tmp_path`` and load it back."""
    return load_workload(write_workload(tmp_path / name, rows, hash_block_tokens=BLOCK))


def multi_turn_rows(num_sessions: int = 4, turns: int = 3, gap_ms: float = 400.0) -> list[dict]:
    """Sessions sharing a 128-token system prompt; each turn re-sends history + answer + message."""
    rows, rid = [], 0
    system = blocks("system", 8)
    for s in range(num_sessions):
        hist = list(system)
        for t in range(turns):
            hist = hist + blocks(("user", s, t), 6)
            rows.append(req(rid, (t * num_sessions + s) * gap_ms, list(hist), out=12, max_new=24,
                            session=s, turn=t))
            hist = hist + blocks(("answer", s, t), 1)
            rid += 1
    return rows
