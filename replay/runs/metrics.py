"""Summary figures computed from a trace alone (a run's or a production capture's).

Where each figure comes from (``docs/replay.md`` repeats this table):

| figure | source |
|---|---|
| ``requests``, ``finished`` | ``request`` rows: arrivals; finish rows (aborts excluded) |
| ``peak_full_used``, ``peak_swa_used``, ``mean_swa_used`` | ``stats`` rows: used = capacity - available (slots not free: held, protected and evictable); the mean is time-weighted over the trace clock |
| ``swa_used_slope_tokens_per_hour`` | least-squares slope of SWA used over the trace clock (hours), of the step function the samples define (so sampling density does not weigh in) |
| ``prefix_hit_ratio`` | finish rows: sum(cached_len) / sum(input_len) (cached_len is what the server reports as ``cached_tokens``) |
| ``host_hit_ratio`` | ``cache`` match rows, each request's last match: sum(host_hit) / sum(input_len) of finished requests |
| ``retractions`` | ``sched`` retract rows |
| ``swa_evicted_tokens`` | ``cache`` evict rows: sum(swa_tokens) (tree eviction and tombstoning; out-of-window releases of running requests are ``swa_released_tokens``) |
| ``host_alloc_cpu_ns``, ``host_free_cpu_ns`` | ``pool`` rows of the host pools: sum(dur_ns) of alloc / free, measured CPU of the real allocator calls (a merge right after a free is that free's cost) |

A trace captured at ``detail=steps`` has no ``pool``/``cache``/admission rows: the figures from
those (``host_hit_ratio``, ``swa_evicted_tokens``, ``swa_released_tokens``, ``retractions``,
``host_alloc_cpu_ns``, ``host_free_cpu_ns``) are then None (unknown, not zero).

Trace-clock figures of a replay run are on the virtual clock (its step-cost model); of a
capture, on the server's monotonic clock.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

NS_PER_HOUR = 3_600_000_000_000


def trace_metrics(path: str | Path) -> dict:
    """The trace-derived summary figures of the trace at ``path`` (see the module table)."""
    import polars as pl

    from replay.trace import open_trace

    tr = open_trace(path, strict=False)
    out: dict = {}
    req = tr.lazy("request").select("event", "rid", "input_len", "output_len", "cached_len").collect()
    arrivals = req.filter(pl.col("event") == "arrival")
    finishes = req.filter(pl.col("event") == "finish")
    out["requests"] = arrivals.height
    out["finished"] = finishes.height
    out["served_tokens"] = int(finishes["input_len"].sum() or 0) + int(finishes["output_len"].clip(0).sum() or 0)
    known = finishes.filter(pl.col("cached_len") >= 0)
    input_tokens = int(known["input_len"].sum() or 0)
    out["prefix_hit_ratio"] = _ratio(int(known["cached_len"].sum() or 0), input_tokens)
    out.update(_occupancy(tr))
    out.update(_cache(tr, finishes, int(finishes["input_len"].sum() or 0)))
    out["retractions"] = int(tr.lazy("sched").filter(pl.col("kind") == "retract").select(pl.len()).collect().item())
    out.update(_host_cpu(tr))
    if (tr.manifest.get("options") or {}).get("detail") == "steps":  # those families not captured
        out.update(dict.fromkeys(STEPS_UNKNOWN))
    return out


def sink_metrics(sink) -> dict:
    """The figures :func:`trace_metrics` would read from the trace of a figures-only run, from
    what its :class:`replay.backends.figures.FigureSink` kept."""
    series = sink.series()
    return {"requests": sink.arrivals, "finished": sink.finished,
            "served_tokens": sink.finished_input + sink.finished_output,
            "prefix_hit_ratio": _ratio(sink.known_cached, sink.known_input),
            **occupancy_figures({k: v[:2] for k, v in series.items() if k in ("full", "swa")}),
            "host_hit_ratio": _ratio(sink.host_hit_of_finished(), sink.finished_input),
            "swa_evicted_tokens": sink.swa_evicted, "swa_released_tokens": sink.swa_released,
            "retractions": sink.retractions,
            "host_alloc_cpu_ns": sink.host_alloc_ns, "host_free_cpu_ns": sink.host_free_ns}


# Figures from families a ``detail=steps`` trace does not capture (reported as None there).
STEPS_UNKNOWN = ("host_hit_ratio", "swa_evicted_tokens", "swa_released_tokens", "retractions",
                 "host_alloc_cpu_ns", "host_free_cpu_ns")


def _step_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of the step function that holds ``y[i]`` over ``[x[i], x[i+1])``
    (continuous: the integrals over each interval, so a repeated sample, which only splits an
    interval, changes nothing; the hooks write a pool's sample only when it changed, a replay
    every step, and both give the same slope)."""
    a, b, v = x[:-1], x[1:], y[:-1]
    w = b - a
    t = w.sum()
    su = ((b * b - a * a) / 2).sum()
    suu = ((b ** 3 - a ** 3) / 3).sum()
    sy = (v * w).sum()
    suy = (v * (b * b - a * a) / 2).sum()
    den = t * suu - su * su
    return float((t * suy - su * sy) / den) if den > 0 else 0.0


def _ratio(num: int, den: int) -> float:
    return round(num / den, 6) if den else 0.0


def _occupancy(tr) -> dict:
    import polars as pl

    stats = (tr.lazy("stats").filter(pl.col("pool").is_in(["full", "swa"]))
             .select("ts_ns", "seq", "pool", used=pl.col("capacity") - pl.col("available"))
             .sort("seq").collect())
    series = {}
    for pool in ("full", "swa"):
        s = stats.filter(pl.col("pool") == pool)
        series[pool] = (s["ts_ns"].to_numpy(), s["used"].to_numpy())
    return occupancy_figures(series)


def occupancy_figures(series: dict) -> dict:
    """``peak_full_used``, ``peak_swa_used``, ``mean_swa_used`` and
    ``swa_used_slope_tokens_per_hour`` from each pool's samples in ``seq`` order (``{"full": (ts_ns,
    used), "swa": ...}``, integer arrays; a pool absent or empty has none). Shared by the trace's
    figures and a figures-only run's (:func:`sink_metrics`), so both compute them alike."""
    out = {"peak_full_used": 0, "peak_swa_used": 0, "mean_swa_used": 0.0,
           "swa_used_slope_tokens_per_hour": 0.0}
    for pool in ("full", "swa"):
        ts, used = series.get(pool, ((), ()))
        if len(used):
            out[f"peak_{pool}_used"] = int(np.max(used))
    ts, used = series.get("swa", ((), ()))
    if len(used) >= 2:
        ts = np.asarray(ts).astype(np.float64)
        used = np.asarray(used).astype(np.float64)
        dt = np.diff(ts)
        span = ts[-1] - ts[0]
        out["mean_swa_used"] = round(float((used[:-1] * dt).sum() / span), 3) if span > 0 else float(used.mean())
        if span > 0:
            out["swa_used_slope_tokens_per_hour"] = round(_step_slope((ts - ts[0]) / NS_PER_HOUR, used), 3)
    elif len(used) == 1:
        out["mean_swa_used"] = float(used[0])
    return out


def _cache(tr, finishes, input_tokens: int) -> dict:
    import polars as pl

    cache = tr.lazy("cache")
    evicted = cache.filter(pl.col("op") == "evict").select(pl.col("swa_tokens").sum()).collect().item()
    released = cache.filter(pl.col("op") == "swa_release").select(pl.col("swa_tokens").sum()).collect().item()
    last = (cache.filter(pl.col("op") == "match").filter(pl.col("rid") >= 0)
            .group_by("rid").agg(pl.col("host_hit").sort_by("seq").last()).collect())
    done = last.join(finishes.select("rid"), on="rid", how="semi")
    return {"host_hit_ratio": _ratio(int(done["host_hit"].sum() or 0), input_tokens),
            "swa_evicted_tokens": int(evicted or 0), "swa_released_tokens": int(released or 0)}


def _host_cpu(tr) -> dict:
    """Host allocator CPU: an alloc's ``dur_ns`` includes the merge it triggers (lazy mode: the
    ``merge`` row just before it); a merge right after a free is that free's cost (eager mode:
    the whole-list concatenation each free pays), so it counts as free CPU."""
    import polars as pl

    host = (tr.lazy("pool").filter(pl.col("pool").is_in(["host_full", "host_swa"]))
            .filter(pl.col("op").is_in(["alloc", "free", "merge"]))
            .select("seq", "pool", "op", "dur_ns").sort("seq")
            .with_columns(prev=pl.col("op").shift(1).over("pool")).collect())
    alloc = host.filter(pl.col("op") == "alloc")["dur_ns"].sum()
    free = host.filter((pl.col("op") == "free")
                       | ((pl.col("op") == "merge") & (pl.col("prev") == "free")))["dur_ns"].sum()
    return {"host_alloc_cpu_ns": int(alloc or 0), "host_free_cpu_ns": int(free or 0)}


__all__ = ["occupancy_figures", "sink_metrics", "trace_metrics"]
