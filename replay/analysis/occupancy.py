"""``occupancy``: used, evictable, protected and held slots per pool over time.

Two sources, joined per (pool, time bucket):

* ``stats`` rows (sampled pool state): the last sample in each bucket gives ``capacity``,
  ``available``, ``evictable``, ``protected``, ``held`` and ``used = capacity - available``;
* ``pool`` rows (allocator ops): the running sum of ``alloc`` minus ``free`` slots per pool
  (ordered by ``seq``), whose maximum in the bucket is ``used_events_max``. This counts from the
  start of the trace, so it equals ``used`` only for traces that start with empty pools
  (recordings and replays; a capture attached to a warm server is offset by what it held).

A bucket that has rows of only one source has nulls in the other's columns.
"""

from __future__ import annotations

from replay.analysis._base import as_trace, check_engine, duration_ns, pool_list, sql_list, view

STATS_COLUMNS = ("capacity", "available", "evictable", "protected", "held")
OUT_COLUMNS = ("pool", "t_ns", "t_s", *STATS_COLUMNS, "used", "used_events_max")


def occupancy(trace, pools=None, resample="1s", engine: str = "polars"):
    """Pool occupancy per time bucket.

    Args:
        trace: trace directory or :class:`replay.trace.Trace`.
        pools: pool names (default: the KV pools full, swa, host_full, host_swa).
        resample: bucket width (``"1s"``, ``"100ms"``, ns as int).
        engine: ``"polars"`` (returns a LazyFrame) or ``"duckdb"`` (returns a relation).
    Returns:
        rows ``pool, t_ns (bucket start), t_s, capacity, available, evictable, protected, held,
        used, used_events_max`` sorted by pool and time.
    """
    t = as_trace(trace)
    pools = pool_list(pools)
    res = duration_ns(resample)
    if check_engine(engine) == "duckdb":
        return _duckdb(t, pools, res)
    return _polars(t, pools, res)


def _polars(t, pools, res):
    import polars as pl

    stats = (t.lazy("stats")
             .select("ts_ns", "seq", pl.col("pool").cast(pl.String), *STATS_COLUMNS)
             .filter(pl.col("pool").is_in(pools))
             .with_columns(t_ns=(pl.col("ts_ns") // res) * res)
             .sort("seq")
             .group_by("pool", "t_ns")
             .agg(pl.col(c).last() for c in STATS_COLUMNS)
             .with_columns(used=pl.col("capacity") - pl.col("available")))
    slots = pl.col("num_slots").cast(pl.Int64)
    events = (t.lazy("pool")
              .select("ts_ns", "seq", pl.col("pool").cast(pl.String), pl.col("op").cast(pl.String),
                      "num_slots")
              .filter(pl.col("pool").is_in(pools) & pl.col("op").is_in(("alloc", "free")))
              .with_columns(d=pl.when(pl.col("op") == "alloc").then(slots).otherwise(-slots))
              .with_columns(used_events=pl.col("d").cum_sum().over("pool", order_by="seq"),
                            t_ns=(pl.col("ts_ns") // res) * res)
              .group_by("pool", "t_ns")
              .agg(used_events_max=pl.col("used_events").max()))
    return (stats.join(events, on=["pool", "t_ns"], how="full", coalesce=True)
            .with_columns(t_s=pl.col("t_ns") / 1e9)
            .select(OUT_COLUMNS)
            .sort("pool", "t_ns"))


def _duckdb(t, pools, res):
    con = t.duckdb()
    stats, pool = view(t, "stats"), view(t, "pool")
    plist = sql_list(pools)
    lasts = ", ".join(f"arg_max({c}, seq) AS {c}" for c in STATS_COLUMNS)
    return con.sql(f"""
        WITH s AS (
            SELECT CAST(pool AS VARCHAR) AS pool, (ts_ns // {res}) * {res} AS t_ns, {lasts}
            FROM {stats} WHERE CAST(pool AS VARCHAR) IN {plist} GROUP BY 1, 2),
        e AS (
            SELECT pool, t_ns, max(used_events) AS used_events_max FROM (
                SELECT CAST(pool AS VARCHAR) AS pool, (ts_ns // {res}) * {res} AS t_ns,
                       CAST(SUM(CASE WHEN CAST(op AS VARCHAR) = 'alloc' THEN num_slots
                                     ELSE -num_slots END)
                            OVER (PARTITION BY pool ORDER BY seq ROWS UNBOUNDED PRECEDING)
                            AS BIGINT) AS used_events
                FROM {pool}
                WHERE CAST(pool AS VARCHAR) IN {plist} AND CAST(op AS VARCHAR) IN ('alloc', 'free'))
            GROUP BY 1, 2)
        SELECT pool, t_ns, t_ns / 1e9 AS t_s, {", ".join(STATS_COLUMNS)},
               capacity - available AS used, used_events_max
        FROM s FULL OUTER JOIN e USING (pool, t_ns)
        ORDER BY pool, t_ns""")
