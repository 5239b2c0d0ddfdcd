"""GB figures beside tokens: which bytes per token a run uses (trace / preset / none) and the
occupancy of each pool in GB (docs/capacity.md).

``resolve_bytes(source, model)`` picks the bytes per token of each pool:

- ``preset``: ``--model NAME`` was given (``replay.models``; it wins over what the trace holds,
  and the run says so with ``trace_had_bytes``);
- ``trace``: the source's rank entries hold ``kv_bytes`` (written by the hooks from the server's
  own pool objects; the first rank that has them), or the source is a run whose manifest ``run``
  block names its bytes (a run's rank entries are never read for this: they describe the
  replay backend's stand-in pools, 1 head of dim 1);
- ``none``: neither; GB figures are then None (unknown, not zero).

``gb_figures(trace, bytes_per_token)``: per pool, capacity, peak and time-weighted mean of
used (capacity - available, the ``stats`` rows) times bytes per token, in GB (10^9 bytes).
"""

from __future__ import annotations

from pathlib import Path

GB = 1e9
#: the GB figures of a run summary (None where the pool's bytes are unknown or it has no stats rows)
GB_FIGURES = ("full_pool_gb", "peak_full_used_gb", "mean_full_used_gb", "swa_pool_gb", "peak_swa_used_gb",
              "mean_swa_used_gb", "host_pool_gb", "peak_host_full_used_gb", "peak_host_swa_used_gb")
_POOLS = ("full", "swa", "host_full", "host_swa")


def trace_bytes(source: str | Path) -> dict | None:
    """{pool: bytes per token} recorded in ``source`` (its ``kv_bytes`` rank entries, or a run's
    ``run.kv_bytes``), None when it records none."""
    from tracer.schema.manifest import read_manifest, read_rank_info

    try:
        manifest = read_manifest(Path(source))
    except Exception:
        return None
    if isinstance(manifest.get("run"), dict):  # a run: its rank entries describe the replay's
        run = manifest["run"].get("kv_bytes") or {}  # stand-in pools, the run block the bytes it used
        return dict(run["bytes_per_token"]) if run.get("bytes_per_token") else None
    for rank in manifest.get("ranks") or []:
        try:
            info = read_rank_info(Path(source), int(rank)) or {}
        except Exception:
            continue
        pools = (info.get("kv_bytes") or {}).get("pools") or {}
        got = {p: float(v["bytes_per_token"]) for p, v in pools.items()
               if isinstance(v, dict) and v.get("bytes_per_token")}
        if got:
            return got
    return None


def resolve_bytes(source: str | Path, model: str | None = None) -> dict:
    """The run's ``kv_bytes`` block: ``{"source": trace|preset|none, "model": name|None,
    "bytes_per_token": {pool: float|None}}`` (see the module). Raises ModelError: unknown model."""
    recorded = trace_bytes(source)
    if model is not None:
        from replay.models import preset

        p = preset(model)
        return {"source": "preset", "model": p.name, "bytes_per_token": dict(p.bytes_per_token),
                "trace_had_bytes": recorded is not None}
    if recorded:
        return {"source": "trace", "model": None, "bytes_per_token": recorded}
    return {"source": "none", "model": None, "bytes_per_token": {}}


def _used(tr) -> dict:
    """{pool: (capacity, peak used, time-weighted mean used)} from the ``stats`` rows."""
    import polars as pl

    stats = (tr.lazy("stats").select("ts_ns", "seq", "pool", "capacity", used=pl.col("capacity") - pl.col("available"))
             .sort("seq").collect())
    series = {}
    for pool in _POOLS:
        s = stats.filter(pl.col("pool") == pool)
        if s.height:
            series[pool] = (s["ts_ns"].to_numpy(), s["used"].to_numpy(), int(s["capacity"].max()))
    return pool_usage(series)


def pool_usage(series: dict) -> dict:
    """{pool: (capacity, peak used, time-weighted mean used)} from each pool's samples in ``seq``
    order (``{pool: (ts_ns, used, capacity)}``: integer arrays and the largest capacity; pools
    without samples absent). Shared by a trace's GB figures and a figures-only run's
    (:meth:`replay.backends.figures.FigureSink.series`)."""
    import numpy as np

    out = {}
    for pool in _POOLS:
        if pool not in series or not len(series[pool][1]):
            continue
        ts, used, capacity = series[pool]
        ts = np.asarray(ts).astype(np.float64)
        used = np.asarray(used).astype(np.float64)
        span = ts[-1] - ts[0] if len(ts) >= 2 else 0.0
        mean = float((used[:-1] * np.diff(ts)).sum() / span) if span > 0 else float(used.mean())
        out[pool] = (int(capacity), int(used.max()), mean)
    return out


def gb_figures(trace: str | Path, bytes_per_token: dict) -> dict:
    """:data:`GB_FIGURES` of the trace at ``trace`` with these bytes per token (rounded to 6 places)."""
    from replay.trace import open_trace

    if not bytes_per_token:
        return dict.fromkeys(GB_FIGURES)
    return gb_from_usage(_used(open_trace(trace, strict=False)), bytes_per_token)


def gb_from_usage(used: dict, bytes_per_token: dict) -> dict:
    """:data:`GB_FIGURES` from each pool's (capacity, peak used, mean used) tokens
    (:func:`pool_usage`) with these bytes per token (rounded to 6 places)."""
    out = dict.fromkeys(GB_FIGURES)
    if not bytes_per_token:
        return out

    def gb(tokens: float, pool: str):
        b = bytes_per_token.get(pool)
        return None if b is None else round(tokens * float(b) / GB, 6)

    for pool in ("full", "swa"):
        if pool in used:
            cap, peak, mean = used[pool]
            out[f"{pool}_pool_gb"], out[f"peak_{pool}_used_gb"] = gb(cap, pool), gb(peak, pool)
            out[f"mean_{pool}_used_gb"] = gb(mean, pool)
    host = [p for p in ("host_full", "host_swa") if p in used]
    caps = [gb(used[p][0], p) for p in host]
    if host and None not in caps:
        out["host_pool_gb"] = round(sum(caps), 6)
    for p in host:
        out[f"peak_{p}_used_gb"] = gb(used[p][1], p)
    return out


__all__ = ["GB", "GB_FIGURES", "gb_figures", "gb_from_usage", "pool_usage", "resolve_bytes", "trace_bytes"]
