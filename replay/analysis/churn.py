"""``churn``: tokens allocated and freed per second per pool, evictions, tombstones, retractions.

Per (pool, window):

* ``alloc_tokens``, ``free_tokens``, ``alloc_ops``, ``free_ops`` from ``pool`` rows (only
  ``alloc`` and ``free`` change occupancy), and the rates ``*_tokens_per_s``;
* ``evicted_tokens`` / ``evict_ops`` from ``cache`` rows: ``evict`` rows count their
  ``full_tokens`` against pool ``full`` and their ``swa_tokens`` against ``swa``;
  ``host_evict`` rows count ``host_tokens`` against ``host_full``; ``tombstones`` (SWA
  tombstones created by ``evict`` rows) count against ``swa``;
* ``retractions``: ``sched`` retract rows in the window (all pools; repeated on each row);
* ``eviction_burst``: the window evicted more than ``burst_factor`` times the pool's mean
  evicted tokens per window (over the windows that have any row for that pool).
"""

from __future__ import annotations

from replay.analysis._base import as_trace, check_engine, duration_ns, pool_list, sql_list, view

COUNT_COLUMNS = ("alloc_tokens", "free_tokens", "alloc_ops", "free_ops", "evicted_tokens",
                 "evict_ops", "tombstones")
OUT_COLUMNS = ("pool", "t_ns", "t_s", *COUNT_COLUMNS, "retractions", "alloc_tokens_per_s",
               "free_tokens_per_s", "eviction_burst")
_EVICT_SOURCES = (("evict", "full_tokens", "full"), ("evict", "swa_tokens", "swa"),
                  ("host_evict", "host_tokens", "host_full"))


def churn(trace, window="1s", pools=None, burst_factor: float = 3.0, engine: str = "polars"):
    """Allocator and eviction churn per pool per ``window``.

    Returns a Polars LazyFrame (``engine="polars"``) or a DuckDB relation with columns
    ``pool, t_ns, t_s, alloc_tokens, free_tokens, alloc_ops, free_ops, evicted_tokens,
    evict_ops, tombstones, retractions, alloc_tokens_per_s, free_tokens_per_s, eviction_burst``,
    sorted by pool and time; windows with no row for a pool are absent.
    """
    t = as_trace(trace)
    pools = pool_list(pools)
    win = duration_ns(window, "window")
    if check_engine(engine) == "duckdb":
        return _duckdb(t, pools, win, burst_factor)
    return _polars(t, pools, win, burst_factor)


def _polars(t, pools, win, burst_factor):
    import polars as pl

    bucket = ((pl.col("ts_ns") // win) * win).alias("t_ns")
    op = pl.col("op").cast(pl.String)
    allocs = _allocs_polars(t, pools, win)
    cache = t.lazy("cache").with_columns(op=op)
    parts = []
    for cop, col, pool in _EVICT_SOURCES:
        rows = cache.filter((pl.col("op") == cop) & (pl.col(col) > 0))
        agg = [pl.col(col).cast(pl.Int64).sum().alias("evicted_tokens"),
               pl.len().cast(pl.Int64).alias("evict_ops"),
               (pl.col("tombstones").cast(pl.Int64).sum() if pool == "swa" else pl.lit(0, pl.Int64))
               .alias("tombstones")]
        parts.append(rows.group_by(bucket).agg(agg).with_columns(pool=pl.lit(pool)))
    evicts = (pl.concat(parts, how="diagonal").filter(pl.col("pool").is_in(pools))
              .group_by("pool", "t_ns").agg(pl.col("evicted_tokens", "evict_ops", "tombstones").sum()))
    retracts = (t.lazy("sched").filter(pl.col("kind").cast(pl.String) == "retract")
                .group_by(bucket).agg(retractions=pl.len().cast(pl.Int64)))
    secs = win / 1e9
    return (allocs.join(evicts, on=["pool", "t_ns"], how="full", coalesce=True)
            .join(retracts, on="t_ns", how="left")
            .with_columns(pl.col(*COUNT_COLUMNS, "retractions").fill_null(0).cast(pl.Int64))
            .with_columns(t_s=pl.col("t_ns") / 1e9,
                          alloc_tokens_per_s=pl.col("alloc_tokens") / secs,
                          free_tokens_per_s=pl.col("free_tokens") / secs)
            .with_columns(eviction_burst=(pl.col("evicted_tokens") > 0) & (
                pl.col("evicted_tokens") > burst_factor * pl.col("evicted_tokens").mean().over("pool")))
            .select(OUT_COLUMNS)
            .sort("pool", "t_ns"))


def _allocs_polars(t, pools, win):
    """alloc/free tokens and ops per (pool, window): the big part (every allocator event), run on
    the streaming engine inside ``pl.defer`` (flat memory even under a plain ``.collect()``),
    grouping on the stored enum (no per-row string cast)."""
    import polars as pl

    is_alloc = pl.col("op") == "alloc"
    slots = pl.col("num_slots").cast(pl.Int64)
    q = (t.lazy("pool")
         .select("ts_ns", "pool", "op", "num_slots")
         .filter(pl.col("pool").is_in(pools) & pl.col("op").is_in(("alloc", "free")))
         .group_by("pool", t_ns=(pl.col("ts_ns") // win) * win)
         .agg(alloc_tokens=pl.when(is_alloc).then(slots).otherwise(0).sum(),
              free_tokens=pl.when(is_alloc).then(0).otherwise(slots).sum(),
              alloc_ops=is_alloc.cast(pl.Int64).sum(),
              free_ops=(~is_alloc).cast(pl.Int64).sum()))
    schema = {"pool": pl.String, "t_ns": pl.Int64, "alloc_tokens": pl.Int64, "free_tokens": pl.Int64,
              "alloc_ops": pl.Int64, "free_ops": pl.Int64}
    return pl.defer(lambda: q.collect(engine="streaming").cast(schema), schema=schema)


def _duckdb(t, pools, win, burst_factor):
    con = t.duckdb()
    pool, cache, sched = view(t, "pool"), view(t, "cache"), view(t, "sched")
    plist = sql_list(pools)
    b = f"(ts_ns // {win}) * {win}"
    evict_sql = " UNION ALL ".join(
        f"SELECT '{p}' AS pool, {b} AS t_ns, CAST({col} AS BIGINT) AS tokens, "
        f"CAST({'tombstones' if p == 'swa' else 0} AS BIGINT) AS tomb FROM {cache} "
        f"WHERE CAST(op AS VARCHAR) = '{cop}' AND {col} > 0"
        for cop, col, p in _EVICT_SOURCES)
    secs = win / 1e9
    return con.sql(f"""
        WITH a AS (
            SELECT CAST(pool AS VARCHAR) AS pool, {b} AS t_ns,
                   CAST(SUM(num_slots) FILTER (WHERE CAST(op AS VARCHAR) = 'alloc') AS BIGINT) AS alloc_tokens,
                   CAST(SUM(num_slots) FILTER (WHERE CAST(op AS VARCHAR) = 'free') AS BIGINT) AS free_tokens,
                   CAST(COUNT(*) FILTER (WHERE CAST(op AS VARCHAR) = 'alloc') AS BIGINT) AS alloc_ops,
                   CAST(COUNT(*) FILTER (WHERE CAST(op AS VARCHAR) = 'free') AS BIGINT) AS free_ops
            FROM {pool}
            WHERE CAST(pool AS VARCHAR) IN {plist} AND CAST(op AS VARCHAR) IN ('alloc', 'free')
            GROUP BY 1, 2),
        e AS (
            SELECT pool, t_ns, CAST(SUM(tokens) AS BIGINT) AS evicted_tokens,
                   CAST(COUNT(*) AS BIGINT) AS evict_ops, CAST(SUM(tomb) AS BIGINT) AS tombstones
            FROM ({evict_sql}) WHERE pool IN {plist} GROUP BY 1, 2),
        r AS (
            SELECT {b} AS t_ns, CAST(COUNT(*) AS BIGINT) AS retractions FROM {sched}
            WHERE CAST(kind AS VARCHAR) = 'retract' GROUP BY 1),
        j AS (
            SELECT pool, t_ns,
                   COALESCE(alloc_tokens, 0) AS alloc_tokens, COALESCE(free_tokens, 0) AS free_tokens,
                   COALESCE(alloc_ops, 0) AS alloc_ops, COALESCE(free_ops, 0) AS free_ops,
                   COALESCE(evicted_tokens, 0) AS evicted_tokens, COALESCE(evict_ops, 0) AS evict_ops,
                   COALESCE(tombstones, 0) AS tombstones
            FROM a FULL OUTER JOIN e USING (pool, t_ns))
        SELECT j.pool, j.t_ns, j.t_ns / 1e9 AS t_s, alloc_tokens, free_tokens, alloc_ops, free_ops,
               evicted_tokens, evict_ops, tombstones, COALESCE(r.retractions, 0) AS retractions,
               alloc_tokens / {secs} AS alloc_tokens_per_s, free_tokens / {secs} AS free_tokens_per_s,
               evicted_tokens > 0 AND evicted_tokens > {burst_factor} * AVG(evicted_tokens)
                   OVER (PARTITION BY j.pool) AS eviction_burst
        FROM j LEFT JOIN r USING (t_ns)
        ORDER BY j.pool, j.t_ns""")
