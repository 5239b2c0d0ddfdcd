"""Plotly figures over :mod:`replay.analysis` (shared by the notebooks and the HTML report).

Each function returns a ``plotly.graph_objects.Figure``; none reads files itself. Conventions
(issue #25): every axis names its quantity and unit; colours come from
:mod:`replay.report.palette` (one per pool, state and run; ops are line dashes); a figure
with nothing but zeros is an *empty* figure whose ``layout.meta["empty"]`` is the sentence that
replaces it in the report (:func:`empty_reason`), and a dropped all-zero panel leaves a sentence
in ``layout.meta["notes"]`` (:func:`notes`); long run labels are wrapped (:func:`wrap_label`).
A trace without ``stats`` rows still gets occupancy: ``used`` from the allocator ledger
(Σ alloc − Σ free per pool, ``used_events_max`` of :func:`replay.analysis.occupancy`).
"""

from __future__ import annotations

import re

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from replay.analysis import capacity_curve, churn, compare_runs, host_allocator_cpu, occupancy
from replay.report.palette import CAPACITY_COLOR, OP_DASH, STATE_COLORS, pool_color, run_style

TIME_AXIS = "trace time (s)"
LEDGER = "used (allocator ledger: Σ alloc − Σ free)"
#: compare/proof metric -> (axis title with unit, scale applied to the summary value)
METRICS = {
    "peak_swa_used": ("peak SWA used (slots)", 1), "mean_swa_used": ("mean SWA used (slots)", 1),
    "peak_full_used": ("peak full used (slots)", 1),
    "swa_used_slope_tokens_per_hour": ("SWA used slope (tokens/h)", 1),
    "prefix_hit_ratio": ("prefix-hit ratio (fraction)", 1), "host_hit_ratio": ("host-hit ratio (fraction)", 1),
    "ttft_p50_ms": ("TTFT p50 (ms)", 1), "ttft_p99_ms": ("TTFT p99 (ms)", 1), "queue_p99_ms": ("queue p99 (ms)", 1),
    "host_free_cpu_ns": ("host free CPU (ms)", 1e-6), "host_alloc_cpu_ns": ("host alloc CPU (ms)", 1e-6),
    "retractions": ("retractions (count)", 1), "swa_evicted_tokens": ("SWA evicted (tokens)", 1),
    "finished": ("finished requests (count)", 1), "shrunk_admissions": ("shrunk admissions (count)", 1),
}


def empty_figure(title: str, sentence: str) -> go.Figure:
    """A figure that says ``sentence`` instead of drawing empty axes."""
    fig = go.Figure()
    fig.update_layout(title=title, height=140, meta={"empty": sentence}, xaxis={"visible": False},
                      yaxis={"visible": False},
                      annotations=[{"text": sentence, "showarrow": False, "xref": "paper", "yref": "paper",
                                    "x": 0.5, "y": 0.5}])
    return fig


def empty_reason(fig) -> str | None:
    """The sentence of an empty figure (None: the figure has data)."""
    meta = fig.layout.meta
    return meta.get("empty") if isinstance(meta, dict) else None


def notes(fig) -> list[str]:
    """Sentences for the all-zero panels a figure left out."""
    meta = fig.layout.meta
    return list(meta.get("notes", [])) if isinstance(meta, dict) else []


def wrap_label(label: str, width: int = 16) -> str:
    """``label`` broken after ``/`` or ``,`` (then ``=`` or ``_`` inside a long part) into lines of
    about ``width`` characters, joined with ``<br>`` (Plotly's line break)."""
    parts = []
    for part in re.split(r"(?<=[/,])", str(label)):
        parts += re.split(r"(?<=[=_])", part) if len(part) > width else [part]
    out, cur = [], ""
    for p in parts:
        if cur and len(cur) + len(p) > width:
            out.append(cur)
            cur = p
        else:
            cur += p
    out.append(cur)
    return "<br>".join(x for x in out if x)


def _capacity_of(trace, pool: str):
    server = (getattr(trace, "manifest", None) or {}).get("server") or {}
    v = server.get(f"{pool}_pool_tokens")
    return int(v) if isinstance(v, (int, float)) and v > 0 else None


def occupancy_figure(trace, pools=("full", "swa"), resample="1s", title: str = "Pool occupancy"):
    """Stacked held / protected / evictable slots per pool over time (one row per pool), under the
    capacity; for pools with no ``stats`` rows, ``used`` from the allocator ledger."""
    from replay.analysis._base import as_trace

    t = as_trace(trace)
    df = occupancy(t, pools=pools, resample=resample).collect()
    rows = []
    for p in pools:
        d = df.filter(df["pool"] == p)
        if d.height == 0:
            continue
        stats = d.drop_nulls("capacity")
        if stats.height:
            rows.append((p, "stats", stats))
        elif d["used_events_max"].drop_nulls().len():
            rows.append((p, "ledger", d.drop_nulls("used_events_max")))
    if not rows:
        return empty_figure(title, "No pool occupancy: the trace has neither stats rows nor allocator "
                                   "(pool) rows for the full or SWA pool.")
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{p} pool" + (" (from the allocator ledger: no stats rows)" if src == "ledger"
                                                       else "") for p, src, _ in rows])
    shown = set()
    for i, (p, src, d) in enumerate(rows, start=1):
        if src == "stats":
            for col in ("held", "protected", "evictable"):
                fig.add_trace(go.Scatter(x=d["t_s"], y=d[col], name=col, stackgroup=p, legendgroup=col,
                                         showlegend=col not in shown,
                                         line={"color": STATE_COLORS[col], "width": 0.5}), row=i, col=1)
                shown.add(col)
            cap_x, cap_y = d["t_s"], d["capacity"]
        else:
            fig.add_trace(go.Scatter(x=d["t_s"], y=d["used_events_max"], name=LEDGER, legendgroup="ledger",
                                     showlegend="ledger" not in shown, line={"color": pool_color(p), "width": 2}),
                          row=i, col=1)
            shown.add("ledger")
            cap = _capacity_of(t, p)
            cap_x, cap_y = (d["t_s"], [cap] * d.height) if cap else (None, None)
        if cap_x is not None:
            fig.add_trace(go.Scatter(x=cap_x, y=cap_y, name="capacity", legendgroup="capacity",
                                     showlegend="capacity" not in shown,
                                     line={"color": CAPACITY_COLOR, "dash": "dot", "width": 1}), row=i, col=1)
            shown.add("capacity")
        fig.update_yaxes(title_text="slots (tokens)", rangemode="tozero", row=i, col=1)
    fig.update_xaxes(title_text=TIME_AXIS, row=len(rows), col=1)
    fig.update_layout(title=title, height=140 + 260 * len(rows), legend={"title": "pool state"})
    return fig


def churn_figure(trace, window="1s", pools=("full", "swa"), title: str = "Allocator churn"):
    """Tokens allocated/freed per second (colour: pool, dash: op) and evicted tokens per window."""
    df = churn(trace, window=window, pools=pools).collect()
    present = [p for p in pools if df.filter(df["pool"] == p).height]
    moved = [p for p in present if df.filter(df["pool"] == p).select(
        (df["alloc_tokens"] + df["free_tokens"]).sum()).item()] if present else []
    evicted = [p for p in present if df.filter(df["pool"] == p)["evicted_tokens"].sum()]
    if not moved and not evicted:
        return empty_figure(title, f"No allocator churn: 0 tokens allocated, freed or evicted in the "
                                   f"{'/'.join(pools)} pools.")
    panels = (["allocated / freed (tokens/s)"] if moved else []) + (["evicted (tokens per window)"] if evicted else [])
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=panels, vertical_spacing=0.14)
    row = 1
    if moved:
        for p in moved:
            d = df.filter(df["pool"] == p)
            for op, col in (("alloc", "alloc_tokens_per_s"), ("free", "free_tokens_per_s")):
                fig.add_trace(go.Scatter(x=d["t_s"], y=d[col], name=f"{p} {op}", mode="lines",
                                         line={"color": pool_color(p), "dash": OP_DASH[op],
                                               "width": 2 if op == "alloc" else 1.5}), row=row, col=1)
        fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=row, col=1)
        row += 1
    if evicted:
        for p in evicted:
            d = df.filter(df["pool"] == p)
            fig.add_trace(go.Bar(x=d["t_s"], y=d["evicted_tokens"], name=f"{p} evicted",
                                 marker={"color": pool_color(p), "pattern": {"shape": "/" if p == "swa" else ""}}),
                          row=row, col=1)
        fig.update_yaxes(title_text="tokens per window", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text=TIME_AXIS, row=len(panels), col=1)
    meta = {"notes": [] if evicted else [f"No evictions: 0 tokens evicted from the {'/'.join(present)} "
                                         f"pool{'s' if len(present) > 1 else ''} in every window."]}
    if not moved:
        meta["notes"].append("No allocations or frees in the allocator rows.")
    fig.update_layout(title=title, height=180 + 260 * len(panels), barmode="group", meta=meta)
    return fig


def allocator_cpu_figure(trace, pools=None, title: str = "Allocator CPU time"):
    """Per-op duration distribution (box per pool/op) and free-op duration against free-list size."""
    c = host_allocator_cpu(trace, pools=pools)
    vs = c.vs_free_list.collect()
    if vs.height == 0:
        return empty_figure(title, "No allocator CPU time measured: every allocator row has dur_ns = 0 "
                                   "(not measured at this capture detail, or no allocator rows).")
    groups = sorted(vs.group_by("pool", "op"), key=lambda kv: kv[0])
    has_free_list = vs.filter(vs["op"] == "free")["free_list_slots"].drop_nulls().len() > 0
    cols = 2 if has_free_list else 1
    fig = make_subplots(rows=1, cols=cols, horizontal_spacing=0.12,
                        subplot_titles=["op CPU time per call"] + (["free op CPU time vs free-list size"]
                                                                   if has_free_list else []))
    for (pool, op), d in groups:
        fig.add_trace(go.Box(y=d["dur_ns"] / 1e3, name=wrap_label(f"{pool} {op}", 10), boxpoints=False,
                             marker={"color": pool_color(pool)}, line={"color": pool_color(pool)},
                             showlegend=False), row=1, col=1)
        if op == "free" and has_free_list:
            fig.add_trace(go.Scattergl(x=d["free_list_slots"], y=d["dur_ns"] / 1e3, mode="markers",
                                       name=f"{pool} free", marker={"size": 3, "color": pool_color(pool)}),
                          row=1, col=2)
    fig.update_yaxes(type="log", title_text="CPU time per op (µs, log)", row=1, col=1)
    fig.update_xaxes(title_text="pool and op", tickangle=0, row=1, col=1)
    if has_free_list:
        fig.update_yaxes(type="log", title_text="free CPU time (µs, log)", row=1, col=2)
        fig.update_xaxes(title_text="free-list size before the op (slots)", row=1, col=2)
    meta = {"notes": [] if has_free_list else ["No free-list sizes (no stats rows): the CPU time against "
                                               "free-list size panel is left out."]}
    fig.update_layout(title=title, height=440, meta=meta)
    return fig


def capacity_figure(trace, marks=(), title: str = "Prefix-hit ratio vs full-pool capacity (one-pass LRU)"):
    """The capacity curve, with measured (capacity, hit ratio) points as markers."""
    c = capacity_curve(trace)
    if not c.prompt_tokens:
        return empty_figure(title, "No capacity curve: the trace has no prompt tokens in its request rows.")
    fig = go.Figure(go.Scatter(x=c.capacity_tokens, y=c.hit_ratio, name="predicted (LRU stack distance)",
                               mode="lines", line={"color": pool_color("full"), "width": 2}))
    if marks:
        xs, ys = zip(*marks)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="measured replay",
                                 marker={"size": 10, "color": "#000000", "symbol": "diamond"}))
    fig.update_layout(title=title, xaxis_title="full pool capacity (tokens, log scale)",
                      yaxis_title="prefix-hit ratio (fraction of prompt tokens)",
                      xaxis_type="log", yaxis_range=[0, 1], height=420)
    return fig


def compare_figure(runs, metrics=("peak_swa_used", "mean_swa_used", "prefix_hit_ratio", "ttft_p99_ms",
                                  "host_free_cpu_ns", "retractions"), title: str = "Runs side by side"):
    """One bar panel per metric (axis names the unit), one bar per run (the run's colour); a
    metric that is 0 in every run becomes a sentence (``notes``)."""
    df = compare_runs(runs)
    return metric_bars({r: {m: df[m][i] for m in metrics if m in df.columns} for i, r in enumerate(df["run"])},
                       metrics, title)


def metric_bars(values: dict, metrics, title: str):
    """Bars of ``{label: {metric: value}}``, one panel per metric of :data:`METRICS`."""
    labels = list(values)
    present = [m for m in metrics if any(values[r].get(m) is not None for r in labels)]
    zero = [m for m in present if not any(values[r].get(m) for r in labels)]
    shown = [m for m in present if m not in zero]
    if not shown:
        return empty_figure(title, "Every compared figure is 0 in every run: "
                                   + ", ".join(METRICS.get(m, (m,))[0] for m in present) + ".")
    fig = make_subplots(rows=1, cols=len(shown), horizontal_spacing=0.35 / max(len(shown), 1) + 0.03,
                        subplot_titles=[METRICS.get(m, (m, 1))[0] for m in shown])
    wrapped = [wrap_label(r, 14) for r in labels]
    for i, m in enumerate(shown, start=1):
        scale = METRICS.get(m, (m, 1))[1]
        ys = [None if values[r].get(m) is None else values[r][m] * scale for r in labels]
        fig.add_trace(go.Bar(x=wrapped, y=ys, showlegend=False, name=METRICS.get(m, (m,))[0],
                             marker={"color": [run_style(j)["color"] for j in range(len(labels))]}), row=1, col=i)
        fig.update_yaxes(title_text=METRICS.get(m, (m,))[0], title_standoff=2, row=1, col=i)
    lines = max((w.count("<br>") + 1 for w in wrapped), default=1)
    fig.update_xaxes(tickangle=-90 if len(labels) > 3 else 0, automargin=True, title_text="run")
    fig.update_layout(title=title, height=380 + 14 * lines + (60 if len(labels) > 3 else 0),
                      meta={"notes": [f"{METRICS.get(m, (m,))[0]}: 0 in every run." for m in zero]})
    return fig


def code_figure(axis, metrics=("finished", "ttft_p99_ms", "prefix_hit_ratio", "peak_swa_used", "shrunk_admissions",
                              "retractions"), title: str = "Codes side by side"):
    """Codes compared (a :class:`replay.report.codes.CodeAxis`): one bar panel per metric, one
    group per point (policy and grid values), one bar per code (the code's colour, base first); a
    metric that is 0 in every run becomes a sentence (``notes``)."""
    points = axis.points()
    # label the points by what varies among them (one varying key: its values, the key on the axis)
    vary = [i for i, _ in enumerate(axis.keys) if len({pt[i] for pt in points}) > 1] or [0][:len(axis.keys)]
    def part(pt, i):
        return str(pt[i]) if axis.keys[i] == "policy" or len(vary) == 1 else f"{axis.keys[i]}={pt[i]}"

    labels = ["<br>".join(wrap_label(part(pt, i), 18) for i in vary) or "run" for pt in points]
    x_title = axis.keys[vary[0]] if len(vary) == 1 else "policy, grid point"
    vals = {m: {c: [axis.value(c, pt, m) for pt in points] for c in axis.names} for m in metrics}
    present = [m for m in metrics if any(v is not None for ys in vals[m].values() for v in ys)]
    zero = [m for m in present if not any(v for ys in vals[m].values() for v in ys if v is not None)]
    shown = [m for m in present if m not in zero]
    if not shown:
        return empty_figure(title, "Every compared figure is 0 for every code: "
                                   + ", ".join(METRICS.get(m, (m,))[0] for m in present) + ".")
    fig = make_subplots(rows=1, cols=len(shown), horizontal_spacing=0.35 / max(len(shown), 1) + 0.03,
                        subplot_titles=[METRICS.get(m, (m, 1))[0] for m in shown])
    for i, m in enumerate(shown, start=1):
        scale = METRICS.get(m, (m, 1))[1]
        for j, code in enumerate(axis.names):
            ys = [None if v is None else v * scale for v in vals[m][code]]
            fig.add_trace(go.Bar(x=labels, y=ys, name=code, legendgroup=code, showlegend=i == 1,
                                 marker={"color": run_style(j)["color"]}), row=1, col=i)
        fig.update_yaxes(title_text=METRICS.get(m, (m,))[0], title_standoff=2, row=1, col=i)
    lines = max((w.count("<br>") + 1 for w in labels), default=1)
    fig.update_xaxes(tickangle=-90 if len(labels) > 3 else 0, automargin=True, title_text=x_title)
    fig.update_layout(title=title, barmode="group", legend_title_text="code",
                      height=380 + 14 * lines + (60 if len(labels) > 3 else 0),
                      meta={"notes": [f"{METRICS.get(m, (m,))[0]}: 0 for every code." for m in zero]})
    return fig


def overlay_figure(runs: dict, pool: str = "swa", column: str = "used", resample="1s",
                   title: str | None = None):
    """``column`` of ``pool`` over time for several traces (``{label: trace}``) on one axis, each
    from its first sample; identical curves stay visible (dash and width per run). Traces with
    no ``stats`` rows draw ``used`` from the allocator ledger. ``column="not_evictable"`` is
    ``used − evictable`` (held + protected + unowned: what the doctor's growth trend reads)."""
    title = title or f"{pool} pool {column} over time"
    fig = go.Figure()
    ledger = []
    for i, (label, tr) in enumerate(runs.items()):
        d = occupancy(tr, pools=(pool,), resample=resample).collect()
        y = column
        if d.drop_nulls("capacity").height:
            d = d.drop_nulls("capacity")
            if column == "not_evictable":
                d = d.with_columns(not_evictable=d["used"] - d["evictable"])
        elif column == "used" and d["used_events_max"].drop_nulls().len():
            d, y = d.drop_nulls("used_events_max"), "used_events_max"
            ledger.append(label)
        else:
            continue
        fig.add_trace(go.Scatter(x=d["t_s"] - d["t_s"].min(), y=d[y], name=wrap_label(label, 40), mode="lines",
                                 line=run_style(i)))
    if not fig.data:
        return empty_figure(title, f"No {pool} pool samples in any of the traces.")
    fig.update_layout(title=title, xaxis_title="time since the trace's first sample (s)",
                      yaxis_title=f"{pool} {column.replace('_', ' ')} (slots)", yaxis_rangemode="tozero", height=420,
                      meta={"notes": [f"{', '.join(ledger)}: no stats rows; {pool} used from the allocator "
                                      "ledger (Σ alloc − Σ free)."] if ledger else []})
    return fig
