"""Summary statistics of a workload (``kvtrace workload stats``).

Definitions:
- ``arrival_rate_per_s``: (N - 1) / (last arrival - first arrival); 0 when N < 2 or no spread.
- ``sessions``: distinct ``session_id`` >= 0, plus one per request whose session is unknown (-1).
- ``ideal_reuse_ratio``: share of input tokens in full hash blocks whose page hash was seen in an
  earlier request (an infinite prefix cache keyed by chained hashes; a block counts
  ``hash_block_tokens`` tokens). Partial last blocks never count as reused.
- percentiles: numpy's linear interpolation; ``context_len`` = input_len + output_len.
"""

from __future__ import annotations

import numpy as np

from replay.workloads.io import RequestColumns, Workload

CONTEXT_BUCKETS_TOKENS = (4096, 8192, 16384, 32768, 65536, 131072)


def ideal_reuse_tokens(cols: RequestColumns, hash_block_tokens: int) -> int:
    """Input tokens whose page hash appeared in an earlier request (arrival order)."""
    h = cols.page_hashes
    if len(h) == 0:
        return 0
    _, first = np.unique(h, return_index=True)
    # Chained hashes are distinct within a prompt, so "not a first occurrence" means "seen in an
    # earlier request".
    return int((len(h) - len(first)) * hash_block_tokens)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


def workload_stats(w: Workload) -> dict:
    """Statistics of a workload's arrival rows.

    Args:
        w: a workload (see ``io.read_workload``).

    Returns:
        A JSON-ready dict. Required keys: requests, sessions, arrival_rate_per_s,
        input_len_p50, input_len_p99, output_len_p50, ideal_reuse_ratio; plus more detail.
    """
    c = w.columns
    n = c.num_requests
    ts = c.ts_ns.astype(np.int64)
    span_ns = int(ts[-1] - ts[0]) if n else 0
    sid = c.session_id
    known = sid[sid >= 0]
    sessions = int(len(np.unique(known)) + np.count_nonzero(sid < 0))
    inp = c.input_len.astype(np.int64)
    out = c.output_len.astype(np.int64)
    ctx = inp + np.maximum(out, 0)
    total_in = int(inp.sum())
    reused = ideal_reuse_tokens(c, w.hash_block_tokens)
    per_session = np.unique(known, return_counts=True)[1] if len(known) else np.array([], dtype=np.int64)
    edges = (0,) + CONTEXT_BUCKETS_TOKENS
    hist = {}
    for lo, hi in zip(edges, CONTEXT_BUCKETS_TOKENS):
        hist[f"{lo // 1024}k-{hi // 1024}k"] = int(np.count_nonzero((ctx >= lo) & (ctx < hi)))
    hist[f">={CONTEXT_BUCKETS_TOKENS[-1] // 1024}k"] = int(np.count_nonzero(ctx >= CONTEXT_BUCKETS_TOKENS[-1]))
    return {
        "requests": n,
        "sessions": sessions,
        "arrival_rate_per_s": (n - 1) / (span_ns / 1e9) if n > 1 and span_ns > 0 else 0.0,
        "input_len_p50": _pct(inp, 50),
        "input_len_p99": _pct(inp, 99),
        "output_len_p50": _pct(out, 50),
        "ideal_reuse_ratio": reused / total_in if total_in else 0.0,
        "duration_s": span_ns / 1e9,
        "hash_block_tokens": w.hash_block_tokens,
        "input_len_mean": float(inp.mean()) if n else 0.0,
        "input_len_p90": _pct(inp, 90),
        "input_len_max": int(inp.max()) if n else 0,
        "output_len_mean": float(out.mean()) if n else 0.0,
        "output_len_p99": _pct(out, 99),
        "context_len_p50": _pct(ctx, 50),
        "context_len_p90": _pct(ctx, 90),
        "context_len_p99": _pct(ctx, 99),
        "context_len_max": int(ctx.max()) if n else 0,
        "context_len_histogram": hist,
        "turns_per_session_mean": float(per_session.mean()) if len(per_session) else 0.0,
        "total_input_tokens": total_in,
        "ideal_reused_tokens": reused,
    }


def format_stats(s: dict) -> str:
    """Human-readable rendering of ``workload_stats``."""
    lines = [
        f"requests            {s['requests']:>12,}",
        f"sessions            {s['sessions']:>12,}   ({s['turns_per_session_mean']:.2f} requests/session)",
        f"duration            {s['duration_s']:>12,.1f} s",
        f"arrival rate        {s['arrival_rate_per_s']:>12.3f} req/s",
        f"input len           p50 {s['input_len_p50']:,.0f}  p90 {s['input_len_p90']:,.0f}  "
        f"p99 {s['input_len_p99']:,.0f}  max {s['input_len_max']:,}  mean {s['input_len_mean']:,.0f}",
        f"output len          p50 {s['output_len_p50']:,.0f}  p99 {s['output_len_p99']:,.0f}  "
        f"mean {s['output_len_mean']:,.0f}",
        f"context len         p50 {s['context_len_p50']:,.0f}  p90 {s['context_len_p90']:,.0f}  "
        f"p99 {s['context_len_p99']:,.0f}  max {s['context_len_max']:,}",
        f"ideal prefix reuse  {s['ideal_reuse_ratio']:>12.1%}   "
        f"({s['ideal_reused_tokens']:,} of {s['total_input_tokens']:,} input tokens; "
        f"hash block {s['hash_block_tokens']} tokens)",
        "context length histogram (input + output tokens):",
    ]
    total = max(1, s["requests"])
    for bucket, count in s["context_len_histogram"].items():
        bar = "#" * round(40 * count / total)
        lines.append(f"  {bucket:>10}  {count:>8,}  {bar}")
    return "\n".join(lines)
