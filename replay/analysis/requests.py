"""Per-request and per-page queries: ``prefix_hits``, ``holdings``, ``lifetimes``, ``reuse_intervals``.

* ``prefix_hits``: a waiting request is matched again at every scheduling round, so counting
  ``cache`` match rows overcounts. Each request counts once: its finish row's ``cached_len``
  (what the server reports), else the device + host hit of its last match.
* ``holdings``: KV slot-seconds a request holds in the full pool, from its admission rows
  (``prefix_len`` + the chunks admitted so far, constant between admissions) to its finish row,
  plus its decode tokens growing linearly from the last admission to the finish
  (``output_len * duration / 2``). An estimate from ``sched`` and ``request`` rows: allocator
  rows do not name the request that owns a slot.
* ``lifetimes``/``reuse_intervals``: per cached page (prompt page hash at the trace's page
  size): birth (first request carrying it), uses, hits (the request's ``cached_len`` covers the
  page), last hit, and the first later use that missed it (evicted by then).
"""

from __future__ import annotations

from replay.analysis._base import as_trace, page_size_of


def _requests(t):
    import polars as pl

    req = t.lazy("request").with_columns(pl.col("event").cast(pl.String))
    arrivals = (req.filter(pl.col("event") == "arrival")
                .select("rid", "session_id", "input_len", "max_new_tokens",
                        pl.col("ts_ns").alias("arrival_ns")))
    ends = (req.filter(pl.col("event").is_in(("finish", "abort")))
            .select("rid", pl.col("event").alias("end"), pl.col("ts_ns").alias("end_ns"), "output_len",
                    "cached_len"))
    return arrivals, ends


def prefix_hits(trace):
    """LazyFrame, one row per request: ``rid, session_id, input_len, matches, last_device_hit,
    last_host_hit, cached_len, hit_tokens, source`` (``finish`` | ``last_match`` | ``none``)."""
    import polars as pl

    t = as_trace(trace)
    arrivals, ends = _requests(t)
    matches = (t.lazy("cache").filter((pl.col("op").cast(pl.String) == "match") & (pl.col("rid") >= 0))
               .sort("seq").group_by("rid")
               .agg(matches=pl.len().cast(pl.Int64), last_device_hit=pl.col("device_hit").last(),
                    last_host_hit=pl.col("host_hit").last()))
    cached = pl.col("cached_len")
    last = pl.col("last_device_hit").cast(pl.Int64) + pl.col("last_host_hit").cast(pl.Int64)
    return (arrivals.join(ends.select("rid", "cached_len"), on="rid", how="left")
            .join(matches, on="rid", how="left")
            .with_columns(pl.col("matches").fill_null(0))
            .with_columns(
                hit_tokens=pl.when(cached >= 0).then(cached.cast(pl.Int64)).otherwise(last),
                source=pl.when(cached >= 0).then(pl.lit("finish"))
                .when(pl.col("last_device_hit").is_not_null()).then(pl.lit("last_match"))
                .otherwise(pl.lit("none")))
            .select("rid", "session_id", "input_len", "matches", "last_device_hit", "last_host_hit",
                    "cached_len", "hit_tokens", "source")
            .sort("rid"))


def prefix_hit_ratio(trace) -> float:
    """Σ hit tokens / Σ prompt tokens over the requests with a known hit (0.0 when none)."""
    import polars as pl

    df = prefix_hits(trace).filter(pl.col("hit_tokens").is_not_null()).select(
        pl.col("hit_tokens").sum(), pl.col("input_len").cast(pl.Int64).sum()).collect()
    hit, total = df.row(0)
    return float(hit) / total if total else 0.0


def holdings(trace, by: str = "request"):
    """Full-pool slot-seconds per request (``by="request"``) or per session (``"session"``).

    Request rows: ``rid, session_id, input_len, output_len, admit_ns, end_ns, held_s,
    peak_tokens, slot_seconds``. Session rows: ``session_id, requests, slot_seconds, held_s,
    first_admit_ns, last_end_ns``. Requests never admitted or never ended are left out.
    """
    import polars as pl

    if by not in ("request", "session"):
        raise ValueError(f"by={by!r}: expected 'request' or 'session'")
    t = as_trace(trace)
    arrivals, ends = _requests(t)
    admits = (t.lazy("sched")
              .filter((pl.col("kind").cast(pl.String) == "admit") & (pl.col("chunk_admitted") > 0))
              .select("rid", "seq", "ts_ns", pl.col("prefix_len").cast(pl.Int64),
                      pl.col("chunk_admitted").cast(pl.Int64))
              .sort("seq")
              .join(ends.select("rid", "end_ns"), on="rid", how="inner")
              .with_columns(tokens=pl.col("prefix_len").first().over("rid")
                            + pl.col("chunk_admitted").cum_sum().over("rid"),
                            until=pl.col("ts_ns").shift(-1).over("rid"))
              .with_columns(until=pl.col("until").fill_null(pl.col("end_ns")))
              .group_by("rid")
              .agg(admit_ns=pl.col("ts_ns").min(), last_admit_ns=pl.col("ts_ns").max(),
                   prefill_slot_ns=(pl.col("tokens") * (pl.col("until") - pl.col("ts_ns"))).sum(),
                   prefill_tokens=pl.col("tokens").last()))
    per_req = (admits.join(ends, on="rid").join(arrivals, on="rid", how="left")
               .with_columns(pl.col("output_len").cast(pl.Int64).clip(0))
               .with_columns(
                   slot_seconds=(pl.col("prefill_slot_ns")
                                 + pl.col("output_len") * (pl.col("end_ns") - pl.col("last_admit_ns")) / 2) / 1e9,
                   held_s=(pl.col("end_ns") - pl.col("admit_ns")) / 1e9,
                   peak_tokens=pl.col("prefill_tokens") + pl.col("output_len"))
               .select("rid", "session_id", "input_len", "output_len", "admit_ns", "end_ns", "held_s",
                       "peak_tokens", "slot_seconds")
               .sort("rid"))
    if by == "request":
        return per_req
    return (per_req.group_by("session_id")
            .agg(requests=pl.len().cast(pl.Int64), slot_seconds=pl.col("slot_seconds").sum(),
                 held_s=pl.col("held_s").sum(), first_admit_ns=pl.col("admit_ns").min(),
                 last_end_ns=pl.col("end_ns").max())
            .sort("slot_seconds", "session_id", descending=[True, False]))


def _page_uses(t, page_size):
    """One row per (request, prompt page): ``page_hash, depth, ts_ns, rid, hit``."""
    import polars as pl

    ps = page_size_of(t, page_size)
    hb = int(t.manifest.get("hash_block_tokens") or ps)
    if ps % hb:
        raise ValueError(f"page_size={ps} is not a multiple of the trace's hash_block_tokens={hb}")
    k = ps // hb
    arrivals, ends = _requests(t)
    req = t.lazy("request").filter(pl.col("event").cast(pl.String) == "arrival")
    return (req.select("rid", "ts_ns", "page_hashes")
            .join(ends.select("rid", "cached_len"), on="rid", how="left")
            .with_columns(hit_pages=(pl.col("cached_len").clip(0) // ps).fill_null(0))
            .explode("page_hashes")
            .filter(pl.col("page_hashes").is_not_null())
            .with_columns(block=pl.int_range(pl.len()).over("rid"))
            .filter((pl.col("block") + 1) % k == 0)
            .with_columns(depth=(pl.col("block") + 1) // k - 1)
            .select(pl.col("page_hashes").alias("page_hash"), "depth", "ts_ns", "rid",
                    hit=pl.col("depth") < pl.col("hit_pages")))


def reuse_intervals(trace, page_size: int | None = None):
    """LazyFrame, one row per use of a page after its first: ``page_hash, depth, rid, ts_ns,
    interval_s`` (since the page's previous use), ``hit``."""
    import polars as pl

    t = as_trace(trace)
    return (_page_uses(t, page_size).sort("ts_ns", "rid")
            .with_columns(interval_s=(pl.col("ts_ns") - pl.col("ts_ns").shift(1).over("page_hash")) / 1e9)
            .filter(pl.col("interval_s").is_not_null())
            .select("page_hash", "depth", "rid", "ts_ns", "interval_s", "hit")
            .sort("ts_ns", "rid", "depth"))


def lifetimes(trace, page_size: int | None = None):
    """LazyFrame, one row per prompt page: ``page_hash, depth, birth_ns, uses, hits,
    last_hit_ns, evicted_by_ns`` (first later use that missed), ``mean_reuse_s``."""
    import polars as pl

    t = as_trace(trace)
    uses = _page_uses(t, page_size).sort("ts_ns", "rid")
    ts = pl.col("ts_ns")
    return (uses.group_by("page_hash")
            .agg(depth=pl.col("depth").first(), birth_ns=ts.min(), uses=pl.len().cast(pl.Int64),
                 hits=pl.col("hit").sum().cast(pl.Int64), last_hit_ns=ts.filter(pl.col("hit")).max(),
                 evicted_by_ns=ts.filter(~pl.col("hit") & (ts > ts.min())).min(),
                 mean_reuse_s=ts.diff().mean() / 1e9)
            .sort("birth_ns", "depth", "page_hash"))
