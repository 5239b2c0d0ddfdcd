"""Capacity-plan curves (``kvtrace plan``'s ``plan.json``): prefix-hit ratio, TTFT p99 and peak
SWA against the full/SWA split of one KV budget, with the recommended split, the knee and the
recorded setting marked, and the full pool's one-pass LRU curve as the bound it is."""

from __future__ import annotations

import json
from pathlib import Path

#: the knee: the smallest SWA share whose hit ratio reaches this share of the best feasible one
KNEE_SHARE = 0.99


def load_plan(path: str | Path) -> dict:
    """A plan's ``plan.json`` (``path``: the file or the plan directory)."""
    p = Path(path)
    return json.loads((p / "plan.json" if p.is_dir() else p).read_text())


def plan_frame(plan: dict):
    """Polars DataFrame, one row per split tried (sizes, GB, figures, ``feasible``)."""
    import polars as pl

    cols = ("swa_full_tokens_ratio", "full_pool_tokens", "swa_pool_tokens", "full_gb", "swa_gb", "prefix_hit_ratio",
            "host_hit_ratio", "ttft_p50_ms", "ttft_p99_ms", "retractions", "aborted", "peak_swa_used", "feasible", "status", "stopped_at_s")
    return pl.DataFrame([{c: r.get(c) for c in cols} for r in plan["rows"]], infer_schema_length=None)


def knee(plan: dict) -> dict | None:
    """The first feasible split (smallest SWA share) within ``KNEE_SHARE`` of the best hit ratio."""
    ok = [r for r in plan["rows"] if r.get("feasible")]
    if not ok:
        return None
    top = max(r["prefix_hit_ratio"] for r in ok)
    return min((r for r in ok if r["prefix_hit_ratio"] >= KNEE_SHARE * top),
               key=lambda r: r["swa_full_tokens_ratio"])


def plan_figure(plan: dict, *, title: str | None = None):
    """Plotly figure: hit ratio (left axis) and TTFT p99 (right axis) against the ratio, the best
    split, the knee and the recorded ratio marked; infeasible splits hollow."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [r for r in plan["rows"] if r.get("status") == "ok"]
    x = [r["swa_full_tokens_ratio"] for r in rows]
    text = [f"full {r['full_pool_tokens']:,} tok ({r['full_gb']:.2f} GB), swa {r['swa_pool_tokens']:,} tok "
            f"({r['swa_gb']:.2f} GB), retractions {r['retractions']}, aborted {r['aborted']}" for r in rows]
    sym = ["circle" if r.get("feasible") else "circle-open" for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=x, y=[r["prefix_hit_ratio"] for r in rows], name="prefix-hit ratio",
                             mode="lines+markers", marker={"symbol": sym, "size": 9}, text=text), secondary_y=False)
    fig.add_trace(go.Scatter(x=x, y=[r["ttft_p99_ms"] for r in rows], name="TTFT p99 (ms)", mode="lines+markers",
                             line={"dash": "dot"}, marker={"symbol": sym}, text=text), secondary_y=True)
    stopped = [r for r in plan["rows"] if r.get("status") == "stopped"]
    if stopped:  # replays ended at their first retraction or abort: no figures, a mark on the axis
        fig.add_trace(go.Scatter(x=[r["swa_full_tokens_ratio"] for r in stopped], y=[0.0] * len(stopped),
                                 name="infeasible (replay stopped at its first retraction/abort)", mode="markers",
                                 marker={"symbol": "x", "size": 10, "color": "crimson"},
                                 text=[f"first {'abort' if r['aborted'] and not r['retractions'] else 'retraction'}"
                                       f" at {r['stopped_at_s']:,.1f} s" for r in stopped]), secondary_y=False)
    bound = plan.get("attainable_hit_ratio")
    if bound:
        fig.add_hline(y=bound, line={"dash": "dash", "color": "grey"},
                      annotation_text="one-pass LRU bound (full pool)", secondary_y=False)
    best, k = plan.get("best"), knee(plan)
    if best:
        fig.add_vline(x=best["swa_full_tokens_ratio"], line={"color": "green"}, annotation_text="recommended")
    if k and (not best or k["swa_full_tokens_ratio"] != best["swa_full_tokens_ratio"]):
        fig.add_vline(x=k["swa_full_tokens_ratio"], line={"color": "orange", "dash": "dash"}, annotation_text="knee")
    rec = plan.get("recorded_ratio")
    if rec is not None:
        fig.add_vline(x=rec, line={"color": "red", "dash": "dot"}, annotation_text="recorded")
    c = plan.get("config", {})
    fig.update_layout(title=title or f"Full/SWA split of {c.get('kv_gb')} GB: {c.get('source')}",
                      xaxis_title="swa_full_tokens_ratio (SWA tokens per full token)", hovermode="x unified")
    fig.update_yaxes(title_text="prefix-hit ratio", secondary_y=False)
    fig.update_yaxes(title_text="TTFT p99 (ms)", secondary_y=True)
    return fig


__all__ = ["KNEE_SHARE", "knee", "load_plan", "plan_figure", "plan_frame"]
