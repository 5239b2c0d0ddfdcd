"""Small workloads and trace readers of the claim scenarios (docs/claims.md).

Every builder returns arrival rows for ``replay.backends.sglang.write_workload`` (16-token hash
blocks; prompts are chains of named blocks, so two prompts share a prefix exactly when they share
their leading block names). The sizes of each scenario are chosen so that one replay takes a few
seconds on the real sglang 0.5.23 classes and the compared policies differ in the claimed way;
``docs/claims.md`` lists the measured values and the command line of each.
"""

from __future__ import annotations

from pathlib import Path

from replay.backends.sglang import write_workload
from replay.runs import RunSummary, replay_run
from tests.sglang.backend_util import BLOCK, blocks, req

#: session ids at or above this are the "hot" session of the churn scenario
HOT_SESSION = 100

# ---- claim 1: multi-turn churn (window-aware vs full-ancestry SWA LRU refresh)
CHURN_SETS = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=65536, swa_pool_tokens=1536,
                  chunked_prefill_size=4096, max_prefill_tokens=8192, max_running_requests=8)


def churn_rows(cold_sessions: int = 8, cold_turns: int = 4, cold_period_ms: float = 3000.0,
               doc_blocks: int = 64, hot_gap_ms: float = 250.0) -> list[dict]:
    """One hot session over a long document plus cold multi-turn sessions.

    The hot session (id ``HOT_SESSION``) re-sends a ``doc_blocks``-block document plus its growing
    chat every ``hot_gap_ms``; each of ``cold_sessions`` sessions sends a turn (its history + 4 new
    blocks) every ``cold_period_ms``. Full-ancestry refresh moves the hot document's out-of-window
    SWA to MRU at every hot match, so SWA pressure falls on the cold sessions' leaves; window-aware
    refresh lets the document's SWA age out instead.
    """
    out = []
    system = blocks("system", 2)
    for s in range(cold_sessions):
        hist = list(system)
        for t in range(cold_turns):
            hist = hist + blocks(("cold-user", s, t), 4)
            out.append((t * cold_period_ms + s * cold_period_ms / cold_sessions + 50.0, list(hist), s, t))
            hist = hist + blocks(("cold-answer", s, t), 1)
    hist = blocks("doc", doc_blocks)
    for t in range(int(cold_turns * cold_period_ms // hot_gap_ms)):
        hist = hist + blocks(("hot-user", t), 1)
        out.append((t * hot_gap_ms, list(hist), HOT_SESSION, t))
        hist = hist + blocks(("hot-answer", t), 1)
    out.sort(key=lambda r: r[0])
    return [req(i, ts, h, out=12, max_new=16, session=s, turn=t) for i, (ts, h, s, t) in enumerate(out)]


# ---- claim 2: a prompt whose SWA need is >= the SWA pool
NEVER_FITS_SETS = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=16384, swa_pool_tokens=512,
                       chunked_prefill_size=4096, max_prefill_tokens=8192, max_running_requests=8)


def never_fits_rows(long_tokens: int = 2048, shorts: int = 8) -> list[dict]:
    """One ``long_tokens`` prompt at t=0 (SWA need ~ long_tokens + ps >= the 512-slot SWA pool)
    and ``shorts`` 64-token prompts 100 ms apart."""
    rows = [req(0, 0.0, blocks("long", long_tokens // BLOCK), out=8, max_new=8)]
    rows += [req(i, i * 100.0, blocks(("short", i), 4), out=8, max_new=8) for i in range(1, shorts + 1)]
    return rows


# ---- claim 3: host (HiCache) free CPU vs host pool size
HOST_SETS = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=16384, swa_pool_tokens=4096,
                 chunked_prefill_size=8192, max_prefill_tokens=8192, max_running_requests=8)
HOST_POOL_SIZES = (65536, 262144, 1048576)


def host_fill_rows(num: int = 160, prompt_tokens: int = 8192) -> list[dict]:
    """``num`` unique prompts 20 ms apart: 1.3 M tokens written through to the host, so every host
    pool size up to 1 M slots fills and evicts (host frees happen only under host eviction)."""
    return [req(i, i * 20.0, blocks(("unique", i), prompt_tokens // BLOCK), out=2, max_new=2) for i in range(num)]


# ---- claim 4: long chunked prefills
CHUNKED_SETS = dict(page_size=16, sliding_window_tokens=32, full_pool_tokens=16384, swa_pool_tokens=8192,
                    chunked_prefill_size=256, max_prefill_tokens=512, max_running_requests=8)


def long_prompt_rows(tokens: int) -> list[dict]:
    """One prompt of ``tokens`` tokens (>> the 256-token chunk), 4 output tokens."""
    return [req(0, 0.0, blocks(("long", tokens), tokens // BLOCK), out=4, max_new=4)]


# ---- claim 5: page_size > W
BOUNDARY_SETS = dict(page_size=64, sliding_window_tokens=32, full_pool_tokens=16384, swa_pool_tokens=2048,
                     chunked_prefill_size=256, max_prefill_tokens=512, max_running_requests=8)


def boundary_rows() -> list[dict]:
    """12 requests over 6 shared 640-token prompts (unaligned tails), 129..300 output tokens, so
    decode releases (every 128 tokens), chunked inserts and finished inserts all cross the
    64-token pages with a 32-token window."""
    outs = [129, 150, 200, 257, 300, 170]
    return [req(i, i * 150.0, blocks(("prompt", i % 6), 40), out=outs[i % 6], max_new=outs[i % 6],
                input_len=640 + 7 * i % 16) for i in range(12)]


# ---- helpers

def write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    return write_workload(tmp_path / name, rows, hash_block_tokens=BLOCK)


def replay(workload: Path, out: Path, sets: dict, policy: str = "swa-fixes", **over) -> RunSummary:
    """``replay_run`` under ``policy`` with the scenario's sizes and ``over`` knob values."""
    return replay_run(workload, out, policy=policy, sets={**sets, **over})


def stats(run: Path, pool: str = "swa"):
    """The run's ``stats`` rows of ``pool`` in order, with ``used`` = capacity - available."""
    import polars as pl

    from replay.trace import open_trace

    return (open_trace(run).lazy("stats").filter(pl.col("pool") == pool).sort("seq")
            .with_columns(used=pl.col("capacity") - pl.col("available")).collect())


def identity_breaks(run: Path, pool: str = "swa"):
    """``stats`` rows of ``pool`` where available + evictable + protected + held != capacity."""
    import polars as pl

    s = stats(run, pool)
    return s.filter(pl.col("available") + pl.col("evictable") + pl.col("protected") + pl.col("held")
                    != pl.col("capacity"))


def requests(run: Path):
    """Finish/abort rows of the run joined with their arrival's session id."""
    import polars as pl

    from replay.trace import open_trace

    r = open_trace(run).lazy("request").collect()
    arrivals = r.filter(pl.col("event") == "arrival").select("rid", "session_id")
    return r.filter(pl.col("event") != "arrival").drop("session_id").join(arrivals, on="rid", how="left")


def hit_ratio(rows) -> float:
    """sum(cached_len) / sum(input_len) of finish rows."""
    import polars as pl

    done = rows.filter(pl.col("event") == "finish")
    return float(done["cached_len"].sum()) / float(done["input_len"].sum())


def host_free_cost_ns(run: Path, pool: str) -> list[int]:
    """CPU of each host ``free`` of ``pool``: the free's ``dur_ns`` plus the ``merge`` right after it
    (eager mode's whole-list concatenation; ``replay.runs.metrics._host_cpu`` counts it the same)."""
    import polars as pl

    from replay.trace import open_trace

    rows = (open_trace(run).lazy("pool").filter(pl.col("pool") == pool)
            .filter(pl.col("op").is_in(["alloc", "free", "merge"])).sort("seq")
            .select("op", "dur_ns").collect())
    ops, durs = rows["op"].cast(str).to_list(), rows["dur_ns"].to_list()
    out = []
    for i, op in enumerate(ops):
        if op == "free":
            extra = durs[i + 1] if i + 1 < len(ops) and ops[i + 1] == "merge" else 0
            out.append(int(durs[i]) + int(extra))
    return out
