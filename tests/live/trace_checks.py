"""Checks of a trace captured from a live server against what the server itself reported."""

from __future__ import annotations

import re
from collections import Counter

from tests.sglang.hooks_util import rows

PREFILL_LOG = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def request_rows(trace, rank: int = 0) -> dict[str, list[dict]]:
    """{rid_str: request rows in seq order} of one rank."""
    out: dict[str, list[dict]] = {}
    for r in rows(trace, "request", rank):
        out.setdefault(r["rid_str"], []).append(r)
    return out


def lifecycle_problems(by_rid: dict[str, list[dict]], sent: dict[str, str]) -> list[str]:
    """Each sent rid must have exactly [arrival, <end>] where <end> is sent[rid] (finish/abort)."""
    bad = []
    for rid, end in sent.items():
        evs = [str(r["event"]) for r in by_rid.get(rid, [])]
        if evs != ["arrival", end]:
            bad.append(f"{rid}: events {evs}, expected ['arrival', '{end}']")
    return bad


def end_row(by_rid: dict[str, list[dict]], rid: str) -> dict:
    return by_rid[rid][-1]


def step_rows(trace, rank: int = 0) -> list[dict]:
    return [r for r in rows(trace, "sched", rank) if str(r["kind"]) == "step"]


def prefill_log_batches(log_text: str) -> list[tuple[int, int, int]]:
    """(#new-seq, #new-token, #cached-token) of every "Prefill batch" line of a server log."""
    return [tuple(int(g) for g in m.groups()) for m in PREFILL_LOG.finditer(log_text)]


def ledger_until(trace, rank: int, stop_seq: int) -> dict[str, int]:
    """Σ alloc − Σ free of num_slots per pool over pool rows with seq < stop_seq."""
    out: Counter = Counter()
    for r in rows(trace, "pool", rank):
        if r["seq"] >= stop_seq:
            break
        if str(r["op"]) == "alloc":
            out[str(r["pool"])] += int(r["num_slots"])
        elif str(r["op"]) == "free":
            out[str(r["pool"])] -= int(r["num_slots"])
    return dict(out)


def clear_seqs(trace, rank: int = 0) -> list[int]:
    """seqs of the `clear` markers (one per pool for a /flush_cache) in the pool family."""
    return [int(r["seq"]) for r in rows(trace, "pool", rank) if str(r["op"]) == "clear"]


def last_stats_before(trace, rank: int, pool: str, seq: int) -> dict | None:
    found = None
    for r in rows(trace, "stats", rank):
        if r["seq"] >= seq:
            break
        if str(r["pool"]) == pool:
            found = r
    return found
