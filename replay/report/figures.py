"""Plotly figures over :mod:`replay.analysis` (shared by the notebooks and the HTML report).

Each function returns a ``plotly.graph_objects.Figure``; none reads files itself.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from replay.analysis import capacity_curve, churn, compare_runs, host_allocator_cpu, occupancy

_STACK = (("held", "#d62728"), ("protected", "#ff7f0e"), ("evictable", "#2ca02c"))


def occupancy_figure(trace, pools=("full", "swa"), resample="1s", title: str = "Pool occupancy"):
    """Stacked held / protected / evictable slots per pool over time (one row per pool)."""
    df = occupancy(trace, pools=pools, resample=resample).collect()
    present = [p for p in pools if p in set(df["pool"].to_list())]
    fig = make_subplots(rows=max(len(present), 1), cols=1, shared_xaxes=True,
                        subplot_titles=[f"{p} pool" for p in present])
    for i, p in enumerate(present, start=1):
        d = df.filter(df["pool"] == p).drop_nulls("capacity")
        for col, color in _STACK:
            fig.add_trace(go.Scatter(x=d["t_s"], y=d[col], name=f"{p} {col}", stackgroup=p,
                                     line={"color": color, "width": 0.5}, legendgroup=col), row=i, col=1)
        fig.add_trace(go.Scatter(x=d["t_s"], y=d["capacity"], name=f"{p} capacity",
                                 line={"color": "black", "dash": "dot"}), row=i, col=1)
    fig.update_layout(title=title, height=320 * max(len(present), 1), xaxis_title="trace time (s)")
    return fig


def churn_figure(trace, window="1s", pools=("full", "swa"), title: str = "Allocator churn"):
    """Tokens allocated/freed per second and evicted tokens per window, per pool."""
    df = churn(trace, window=window, pools=pools).collect()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True,
                        subplot_titles=["alloc / free tokens per s", "evicted tokens per window"])
    for p in pools:
        d = df.filter(df["pool"] == p)
        if d.height == 0:
            continue
        fig.add_trace(go.Scatter(x=d["t_s"], y=d["alloc_tokens_per_s"], name=f"{p} alloc/s"), row=1, col=1)
        fig.add_trace(go.Scatter(x=d["t_s"], y=d["free_tokens_per_s"], name=f"{p} free/s",
                                 line={"dash": "dot"}), row=1, col=1)
        fig.add_trace(go.Bar(x=d["t_s"], y=d["evicted_tokens"], name=f"{p} evicted"), row=2, col=1)
    fig.update_layout(title=title, height=600, xaxis2_title="trace time (s)")
    return fig


def allocator_cpu_figure(trace, pools=None, title: str = "Allocator CPU time"):
    """Per-op duration distribution (box per pool/op) and duration against free-list size."""
    c = host_allocator_cpu(trace, pools=pools)
    vs = c.vs_free_list.collect()
    fig = make_subplots(rows=1, cols=2, subplot_titles=["op duration (µs)", "free op µs vs free-list slots"])
    for (pool, op), d in sorted(vs.group_by("pool", "op"), key=lambda kv: kv[0]):
        fig.add_trace(go.Box(y=d["dur_ns"] / 1e3, name=f"{pool} {op}", boxpoints=False), row=1, col=1)
        if op == "free":
            fig.add_trace(go.Scattergl(x=d["free_list_slots"], y=d["dur_ns"] / 1e3, mode="markers",
                                       name=f"{pool} free", marker={"size": 3}), row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def capacity_figure(trace, marks=(), title: str = "Prefix-hit ratio vs full-pool capacity (one-pass LRU)"):
    """The capacity curve, with measured (capacity, hit ratio) points as markers."""
    c = capacity_curve(trace)
    fig = go.Figure(go.Scatter(x=c.capacity_tokens, y=c.hit_ratio, name="predicted (LRU stack distance)",
                               mode="lines"))
    if marks:
        xs, ys = zip(*marks)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="measured replay", marker={"size": 10}))
    fig.update_layout(title=title, xaxis_title="full pool tokens", yaxis_title="device prefix-hit ratio",
                      xaxis_type="log", yaxis_range=[0, 1], height=420)
    return fig


def compare_figure(runs, metrics=("peak_swa_used", "mean_swa_used", "prefix_hit_ratio", "ttft_p99_ms",
                                  "host_free_cpu_ns", "retractions"), title: str = "Runs side by side"):
    """One bar panel per metric, one bar per run."""
    df = compare_runs(runs)
    metrics = [m for m in metrics if m in df.columns]
    fig = make_subplots(rows=1, cols=max(len(metrics), 1), subplot_titles=metrics)
    for i, m in enumerate(metrics, start=1):
        fig.add_trace(go.Bar(x=df["run"], y=df[m], name=m, showlegend=False), row=1, col=i)
    fig.update_layout(title=title, height=420)
    return fig


def overlay_figure(runs: dict, pool: str = "swa", column: str = "used", resample="1s",
                   title: str | None = None):
    """``column`` of ``pool`` over time for several traces (``{label: trace}``) on one axis."""
    fig = go.Figure()
    for label, tr in runs.items():
        d = occupancy(tr, pools=(pool,), resample=resample).collect().drop_nulls("capacity")
        fig.add_trace(go.Scatter(x=d["t_s"], y=d[column], name=label, mode="lines"))
    fig.update_layout(title=title or f"{pool} pool {column} over time", xaxis_title="trace time (s)",
                      yaxis_title=f"{column} slots", height=420)
    return fig
