"""Capacity-curve figure (``kvtrace capacity``'s ``capacity.json``): prefix-hit and host-hit ratio,
TTFT p50/p99 and peak/mean SWA used against one pool's size, in tokens with GB on the ticks, the
full pool's one-pass LRU hit ratio beside the replays as the fast bound it is, and sizes with
retractions or aborts hollow."""

from __future__ import annotations

from pathlib import Path


def load_capacity(path: str | Path):
    """A capacity sweep's result (:func:`replay.runs.capacity.load_capacity`)."""
    from replay.runs.capacity import load_capacity as _load

    return _load(path)


def capacity_figure(res, *, title: str | None = None):
    """Plotly figure of a :class:`replay.runs.capacity.CapacitySweep` (or its ``to_dict()``): three
    rows sharing the size axis (log): hit ratios with the one-pass bound; TTFT p50/p99; SWA used
    (peak, mean) with the SWA pool size, where it is the pool swept."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d = res if isinstance(res, dict) else res.to_dict()
    c = d["config"]
    rows = [r for r in d["rows"] if r.get("status") == "ok"]
    x = [r["size_tokens"] for r in rows]
    sym = ["circle" if not (r.get("retractions") or r.get("aborted")) else "circle-open" for r in rows]
    text = [f"{r['size_tokens']:,} tokens" + (f" ({r['size_gb']:.3f} GB)" if r.get("size_gb") is not None else "")
            + f", retractions {r.get('retractions')}, aborted {r.get('aborted')}, "
              f"finished {r.get('finished')}/{r.get('requests')}" for r in rows]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("hit ratio", "TTFT (ms)", "SWA used (tokens)"))

    def line(y, name, row, dash=None, color=None, markers=True):
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers" if markers else "lines", text=text,
                                 marker={"symbol": sym, "size": 8}, line={"dash": dash, "color": color}),
                      row=row, col=1)

    line([r["prefix_hit_ratio"] for r in rows], "prefix-hit ratio", 1, color="#1f77b4")
    if any(r.get("host_hit_ratio") for r in rows):
        line([r["host_hit_ratio"] for r in rows], "host hit ratio", 1, dash="dot", color="#9467bd")
    bound = [r.get("one_pass_hit_ratio") for r in rows]
    if any(b is not None for b in bound):
        where = "at each size" if c["pool"] == "full" else f"at the full pool's {c['full_pool_tokens']:,} tokens"
        line(bound, f"one-pass LRU bound ({where})", 1, dash="dash", color="grey", markers=False)
    line([r["ttft_p50_ms"] for r in rows], "TTFT p50 (ms)", 2, color="#2ca02c")
    line([r["ttft_p99_ms"] for r in rows], "TTFT p99 (ms)", 2, dash="dot", color="#d62728")
    line([r["peak_swa_used"] for r in rows], "peak SWA used", 3, color="#ff7f0e")
    line([r["mean_swa_used"] for r in rows], "mean SWA used", 3, dash="dot", color="#8c564b")
    if c["pool"] == "swa":
        line(x, "SWA pool size", 3, dash="dash", color="lightgrey", markers=False)
    ticks = [f"{r['size_tokens']:,}" + (f"<br>{r['size_gb']:.2f} GB" if r.get("size_gb") is not None else "")
             for r in rows]
    fig.update_xaxes(type="log", tickvals=x, ticktext=ticks)
    fig.update_xaxes(title_text=f"{c['pool']} pool size (tokens, GB)", row=3, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=title or f"Capacity curves of the {c['pool']} pool: {c['source']}",
                      hovermode="x unified", height=820)
    return fig


__all__ = ["capacity_figure", "load_capacity"]
