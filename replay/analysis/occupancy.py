"""``occupancy``: used, evictable, protected and held slots per pool over time.

Two sources, joined per (pool, time bucket):

* ``stats`` rows (sampled pool state): the last sample in each bucket gives ``capacity``,
  ``available``, ``evictable``, ``protected``, ``held`` and ``used = capacity - available``;
* ``pool`` rows (allocator ops): the running sum of ``alloc`` minus ``free`` slots per pool
  (ordered by ``seq``), whose maximum in the bucket is ``used_events_max``. This counts from the
  start of the trace, so it equals ``used`` only for traces that start with empty pools
  (recordings and replays; a capture attached to a warm server is offset by what it held).

A bucket that has rows of only one source has nulls in the other's columns.

Scale: the running sum is the only ordered part. When the ``pool`` segments of a one-rank trace
are already in ``seq`` order file after file (each segment is sorted by ``seq``, a trace
invariant the reader relies on too; the seq ranges of consecutive segments, read from the
Parquet statistics, must not overlap), it is computed in ONE streaming pass in file order: one
running-sum column per pool (Polars ``cum_sum`` on the streaming engine, DuckDB's streaming
``SUM() OVER (ROWS UNBOUNDED PRECEDING)``, only for the pools that have allocator rows), then a
max per (pool, bucket). Nothing is sorted; at 100 M events DuckDB peaks at 0.2 GB, Polars at
< 1 GB (docs/analysis.md, Scale). Otherwise (several ranks, overlapping segments)
it falls back to a window ordered by ``seq`` (then ``rank``: with several ranks the pool's
running sum adds up the ranks, interleaved by their seqs) over all events, which holds them
all in memory (about 130 MB per 1 M events). Both paths give the same numbers (tests/analysis/test_scale.py).
"""

from __future__ import annotations

from replay.analysis._base import as_trace, check_engine, duration_ns, pool_list, sql_list, view

STATS_COLUMNS = ("capacity", "available", "evictable", "protected", "held")
OUT_COLUMNS = ("pool", "t_ns", "t_s", *STATS_COLUMNS, "used", "used_events_max")


def occupancy(trace, pools=None, resample="1s", engine: str = "polars", streaming: bool | None = None):
    """Pool occupancy per time bucket.

    Args:
        trace: trace directory or :class:`replay.trace.Trace`.
        pools: pool names (default: the KV pools full, swa, host_full, host_swa).
        resample: bucket width (``"1s"``, ``"100ms"``, ns as int).
        engine: ``"polars"`` (returns a LazyFrame) or ``"duckdb"`` (returns a relation).
        streaming: compute ``used_events_max`` in one streaming pass in file order (None: when
            :func:`events_in_seq_order` says the files allow it; False: always the ordered
            window over all events; True: insist, ValueError when the files do not allow it).
    Returns:
        rows ``pool, t_ns (bucket start), t_s, capacity, available, evictable, protected, held,
        used, used_events_max`` sorted by pool and time.
    """
    t = as_trace(trace)
    pools = pool_list(pools)
    res = duration_ns(resample)
    ordered = events_in_seq_order(t)
    if streaming is None:
        streaming = ordered
    elif streaming and not ordered:
        raise ValueError(f"occupancy(streaming=True): the pool segments of {t.path} are not in seq "
                         f"order file after file (several ranks or overlapping seq ranges); "
                         f"use streaming=None or False")
    if check_engine(engine) == "duckdb":
        return _duckdb(t, pools, res, streaming)
    return _polars(t, pools, res, streaming)


def events_in_seq_order(trace) -> bool:
    """True when the ``pool`` rows, read file after file, are in ``seq`` order: one rank, and
    each segment's seq range (Parquet statistics) starts after the previous one's ends.
    Rows inside a segment are in seq order by the trace format (the recorder writes them so)."""
    import pyarrow.parquet as pq

    t = as_trace(trace)
    segs = [s for s in t.segments if s.family == "pool"]
    if len({s.rank for s in segs}) > 1:
        return False
    if [s.index for s in segs] != sorted(s.index for s in segs):
        return False
    last = None
    for s in segs:
        md = pq.ParquetFile(s.path).metadata
        if md.num_rows == 0:
            continue
        col = md.schema.to_arrow_schema().get_field_index("seq")
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(col).statistics
            if st is None or not st.has_min_max:
                return False
            if last is not None and st.min <= last:
                return False
            last = st.max
    return True


def _polars(t, pools, res, streaming):
    import polars as pl

    stats = (t.lazy("stats")
             .select("ts_ns", "seq", pl.col("pool").cast(pl.String), *STATS_COLUMNS)
             .filter(pl.col("pool").is_in(pools))
             .with_columns(t_ns=(pl.col("ts_ns") // res) * res)
             .sort("seq")
             .group_by("pool", "t_ns")
             .agg(pl.col(c).last() for c in STATS_COLUMNS)
             .with_columns(used=pl.col("capacity") - pl.col("available")))
    events = _events_streaming_polars(t, pools, res) if streaming else _events_sorted_polars(t, pools, res)
    return (stats.join(events, on=["pool", "t_ns"], how="full", coalesce=True)
            .with_columns(t_s=pl.col("t_ns") / 1e9)
            .select(OUT_COLUMNS)
            .sort("pool", "t_ns"))


def _signed_slots():
    import polars as pl

    slots = pl.col("num_slots").cast(pl.Int64)
    return pl.when(pl.col("op") == "alloc").then(slots).otherwise(-slots)


def _events_sorted_polars(t, pools, res):
    import polars as pl

    return (t.lazy("pool")
            .select("ts_ns", "seq", "rank", pl.col("pool").cast(pl.String), pl.col("op").cast(pl.String),
                    "num_slots")
            .filter(pl.col("pool").is_in(pools) & pl.col("op").is_in(("alloc", "free")))
            .with_columns(d=_signed_slots())
            .with_columns(used_events=pl.col("d").cum_sum().over("pool", order_by=["seq", "rank"]),
                          t_ns=(pl.col("ts_ns") // res) * res)
            .group_by("pool", "t_ns")
            .agg(used_events_max=pl.col("used_events").max()))


def _events_streaming_polars(t, pools, res):
    """One pass in file order: a running-sum column per pool (``cum_sum`` streams), then the
    max per (pool, bucket). Run on the streaming engine inside ``pl.defer`` so that a plain
    ``.collect()`` of the result stays within memory too."""
    import polars as pl

    pool = pl.col("pool")
    q = (t.lazy("pool")
         .select("ts_ns", "pool", "op", "num_slots")
         .filter(pl.col("op").is_in(("alloc", "free")) & pool.is_in(pools))
         .with_columns(d=_signed_slots(), t_ns=(pl.col("ts_ns") // res) * res)
         .with_columns(pl.when(pool == p).then(pl.col("d")).otherwise(0).cum_sum().alias(f"u{i}")
                       for i, p in enumerate(pools))
         .group_by(pool.cast(pl.String), "t_ns")
         .agg(used_events_max=pl.coalesce(pl.when(pool == p).then(pl.col(f"u{i}"))
                                          for i, p in enumerate(pools)).max()))
    schema = {"pool": pl.String, "t_ns": pl.Int64, "used_events_max": pl.Int64}
    return pl.defer(lambda: q.collect(engine="streaming").cast(schema), schema=schema)


def _duckdb(t, pools, res, streaming):
    con = t.duckdb()
    stats, pool = view(t, "stats"), view(t, "pool")
    plist = sql_list(pools)
    lasts = ", ".join(f"arg_max({c}, seq) AS {c}" for c in STATS_COLUMNS)
    if streaming:
        # one running sum per pool is ~40 ns a row in DuckDB's (single-threaded) streaming
        # window: first find the pools that have allocator rows at all (a parallel scan, ~15x
        # cheaper than a running sum); most traces have 1-2 of the 4 KV pools
        present = {r[0] for r in con.sql(
            f"SELECT DISTINCT CAST(pool AS VARCHAR) FROM {pool} WHERE CAST(pool AS VARCHAR) IN {plist} "
            f"AND CAST(op AS VARCHAR) IN ('alloc', 'free')").fetchall()}
        events = _events_streaming_sql(pool, tuple(p for p in pools if p in present), res)
    else:
        events = _events_sorted_sql(pool, plist, res)
    return con.sql(f"""
        WITH s AS (
            SELECT CAST(pool AS VARCHAR) AS pool, (ts_ns // {res}) * {res} AS t_ns, {lasts}
            FROM {stats} WHERE CAST(pool AS VARCHAR) IN {plist} GROUP BY 1, 2),
        e AS ({events})
        SELECT pool, t_ns, t_ns / 1e9 AS t_s, {", ".join(STATS_COLUMNS)},
               capacity - available AS used, used_events_max
        FROM s FULL OUTER JOIN e USING (pool, t_ns)
        ORDER BY pool, t_ns""")


_SIGNED_SQL = "CASE WHEN CAST(op AS VARCHAR) = 'alloc' THEN num_slots ELSE -num_slots END"


def _events_sorted_sql(pool, plist, res):
    return f"""
            SELECT pool, t_ns, max(used_events) AS used_events_max FROM (
                SELECT CAST(pool AS VARCHAR) AS pool, (ts_ns // {res}) * {res} AS t_ns,
                       CAST(SUM({_SIGNED_SQL})
                            OVER (PARTITION BY pool ORDER BY seq, rank ROWS UNBOUNDED PRECEDING)
                            AS BIGINT) AS used_events
                FROM {pool}
                WHERE CAST(pool AS VARCHAR) IN {plist} AND CAST(op AS VARCHAR) IN ('alloc', 'free'))
            GROUP BY 1, 2"""


def _events_streaming_sql(pool, pools, res):
    if not pools:
        return ("SELECT CAST(NULL AS VARCHAR) AS pool, CAST(NULL AS BIGINT) AS t_ns, "
                "CAST(NULL AS BIGINT) AS used_events_max WHERE false")
    # A window with neither PARTITION BY nor ORDER BY and a ROWS UNBOUNDED PRECEDING frame runs
    # as DuckDB's streaming window: in scan order (insertion order is preserved), no sort, no
    # materialisation. One running sum per pool, over the pool's index k (integer compares).
    sums = ", ".join(
        f"CAST(SUM(CASE WHEN k = {i} THEN d ELSE 0 END) OVER (ROWS UNBOUNDED PRECEDING) AS BIGINT) AS u{i}"
        for i in range(len(pools)))
    k = "CASE CAST(pool AS VARCHAR) " + " ".join(f"WHEN '{p}' THEN {i}" for i, p in enumerate(pools)) + " END"
    pick = "CASE k " + " ".join(f"WHEN {i} THEN u{i}" for i in range(len(pools))) + " END"
    name = "CASE k " + " ".join(f"WHEN {i} THEN '{p}'" for i, p in enumerate(pools)) + " END"
    return f"""
            SELECT {name} AS pool, t_ns, max({pick}) AS used_events_max FROM (
                SELECT k, t_ns, {sums} FROM (
                    SELECT {k} AS k, (ts_ns // {res}) * {res} AS t_ns, {_SIGNED_SQL} AS d
                    FROM {pool}
                    WHERE CAST(pool AS VARCHAR) IN {sql_list(pools)}
                      AND CAST(op AS VARCHAR) IN ('alloc', 'free')))
            GROUP BY k, t_ns"""
